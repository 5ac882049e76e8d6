-- The re-seeder counts the run's pages not due by the store's sums: from now
-- on count_page.lua counts none of them one by one. KEYS: the run's counted
-- pages (see count_page.lua), the workers hash, the run's workers that left
-- it, the pages requested that the sum may count (the run's
-- requested_in_sum set: not read here), the run key. ARGV: the re-seeder,
-- its tag, its run's id (a run no longer current: an error FENCED, nothing
-- written; see fence.lua). Returns the pages counted one by one that the sum
-- counts too, and their sizes: those of workers alive or gone with their
-- crawls recorded (a killed worker's counts are lost: the sum keeps its
-- pages, and count_page.lua knows it by #took|<worker>). The pages
-- requested that the sum may count (requested_in_sum, which count_page.lua
-- adds no more to from now on) are read by the caller in chunks: there may
-- be many.
local refused = fenced(KEYS[5], ARGV[3], KEYS[2], ARGV[1])
if refused then return refused end
redis.call('HSET', KEYS[1], '#bulk', ARGV[2], '#w|' .. ARGV[2], ARGV[1])
local workers = redis.call('HKEYS', KEYS[2])
for _, w in ipairs(redis.call('SMEMBERS', KEYS[3])) do workers[#workers + 1] = w end
local pages, size = 0, 0
for _, w in ipairs(workers) do
  local counted = redis.call('HMGET', KEYS[1], '#pages|' .. w, '#size|' .. w)
  pages = pages + tonumber(counted[1] or '0')
  size = size + tonumber(counted[2] or '0')
  redis.call('HSET', KEYS[1], '#took|' .. w, '1')
end
return {pages, size}

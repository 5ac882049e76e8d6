
-- A repair's part in its host's slot on a Redis Cluster (cluster layout 8):
-- the pages deleted (every bucket of the host, or every variant of one
-- page in its bucket), their links records, the host's record or page
-- count, its write generation raised, and what the pages deleted take out
-- of the scope's sums, computed from the records as this script deletes
-- them and taken out of the host group's sums (its scope shard's, in the
-- same slot) in the same script. One run: a page a crawl wrote or changed
-- after the repair planned is deleted and taken out of the sums as it is
-- then, never counted on after its deletion.
--
-- KEYS: the host's record (hd), links (ln), write generation (wg), the
-- group's coarse sums (nvs), the run's token key (its answer, kept
-- TOKEN_TTL: sent again after a lost reply, by the client's retry or the
-- caller's, the script returns it and deletes nothing more), the group's
-- sums' meta (nvm), the group's fine sums' hashes (nvf, k = 0, 1, ...:
-- a visit's in its hour's modulo their number, as cluster_host.lua keeps
-- them), then the two hashes (pg, pgl) of each bucket
-- declared. ARGV: the bucket count planned from, the token, the number of
-- the group's fine sums' hashes, then 'host' (every
-- declared bucket: all of the host's) or 'page' and the page's URL part
-- (its variants too, in the one bucket declared).
-- Returns {'n', count} when the host's bucket count is not the one planned
-- (nothing deleted: the caller plans again), else {pages deleted, links
-- records deleted, 1 when a stored sum could not be taken from (damaged:
-- the group's sums marked lost, P:nvm 'lost', so that every summary reads
-- the pages) else 0}.
local DIR, LINKS, GENERATION, COARSE, RAN = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local META = KEYS[6]
local PLANNED_N, FINE_KEYS = tonumber(ARGV[1]), tonumber(ARGV[3])
local FIRST_BUCKET = 7 + FINE_KEYS
local MODE, URL_PART = ARGV[4], ARGV[5]
local SUM_MINUTE = 60
-- The group's fine sums' hash of a visit (as cluster_host.lua keeps them).
local FINE_SPAN = 3600
local function fine_key(visit)
  return KEYS[7 + math.floor(visit / FINE_SPAN) % FINE_KEYS]
end
local ran = redis.call('GET', RAN)
if ran then return cjson.decode(ran) end
local n = bucket_count(DIR)
if n ~= PLANNED_N then return {'n', n} end

-- Every key written is of its type (or absent), and everything deleted is
-- read (and decoded) first: a damaged key or record fails the repair
-- before anything is deleted (a script that erred halfway would leave it
-- half done).
for _, pair in ipairs({{LINKS, 'hash'}, {COARSE, 'hash'}, {META, 'hash'}, {DIR, 'hash'}}) do
  local kind = redis.call('TYPE', pair[1]).ok
  if kind ~= 'none' and kind ~= pair[2] then
    error('WRONGTYPE ' .. pair[1] .. ' is a ' .. kind .. ', not a ' .. pair[2]
      .. ': nothing was deleted', 0)
  end
end
do
  -- What INCR takes, and can raise without overflowing.
  local kind = redis.call('TYPE', GENERATION).ok
  local v = kind == 'string' and redis.call('GET', GENERATION)
  if kind ~= 'none' and not (v and (v == '0'
      or (string.match(v, '^%-?[1-9]%d*$') and #v <= 18))) then
    error(GENERATION .. ' is not a counter (a ' .. kind .. '): nothing was deleted', 0)
  end
end
local doomed = {}
local fields = {}
local SUMS = {}
local function forget(raw)
  local callback, _, visit, bytes = page_summary(raw)
  if callback then
    local field = string.format('%d', visit) .. '|' .. callback
    local was = SUMS[field] or {0, 0}
    SUMS[field] = {was[1] - 1, was[2] - bytes}
  end
end
for k = FIRST_BUCKET, #KEYS do
  local flat = redis.call('HGETALL', KEYS[k])
  for j = 1, #flat, 2 do
    local field = flat[j]
    if MODE == 'host' or field == URL_PART
        or string.sub(field, 1, #URL_PART + 1) == URL_PART .. '\0' then
      forget(flat[j + 1])
      doomed[#doomed + 1] = {KEYS[k], field}
      fields[field] = true
    end
  end
end

local pages, links = 0, 0
if MODE == 'host' then
  for k = FIRST_BUCKET, #KEYS do
    pages = pages + redis.call('HLEN', KEYS[k])
    redis.call('DEL', KEYS[k])
  end
  links = redis.call('HLEN', LINKS)
  redis.call('DEL', LINKS, DIR)
  redis.call('INCR', GENERATION)
else
  for _, where in ipairs(doomed) do pages = pages + redis.call('HDEL', where[1], where[2]) end
  if pages > 0 then redis.call('HINCRBY', DIR, 'p', -pages) end
  for field in pairs(fields) do links = links + redis.call('HDEL', LINKS, field) end
  if pages > 0 or links > 0 then redis.call('INCR', GENERATION) end
end

-- The sums, added to with group_sums.lua's add_sum (prepended).
local lost = 0
for field, delta in pairs(SUMS) do
  local visit, callback = string.match(field, '^(-?%d+)|(.*)$')
  visit = tonumber(visit)
  local minute = math.floor(visit / SUM_MINUTE)
  if not add_sum(COARSE, minute .. '|' .. callback, delta[1], delta[2]) then lost = 1 end
  if not add_sum(fine_key(visit), field, delta[1], delta[2]) then lost = 1 end
end
if lost == 1 then redis.call('HSET', META, 'lost', redis.call('TIME')[1]) end
local answer = {pages, links, lost}
redis.call('SET', RAN, cjson.encode(answer), 'EX', TOKEN_TTL)
return answer

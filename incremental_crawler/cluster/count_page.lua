-- Count pages for the run, each once: the first worker to count a page does.
-- KEYS[1]: the run's counted pages (page -> column, whether the re-seeder's
-- sum counts it too, stored size: "d1:1234"; and the fields #pages, #size:
-- the pages counted not requested that the sum counts, #bulk: set once the
-- re-seeder counts the sum). A page's field holds NUL bytes: no clash.
-- ARGV: per page, in order: page, column (r requested, d not due, s
-- skipped), size, summed (0/1). Returns what the run had for each: ""
-- nothing (the caller counts it), "b" the re-seeder's sum, else the page's
-- field as it was.
local had = {}
for i = 1, #ARGV, 4 do
  local page, column, size, summed = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local old = redis.call('HGET', KEYS[1], page)
  local requested = column == 'r'
  if not old then
    if summed == '1' and redis.call('HEXISTS', KEYS[1], '#bulk') == 1 then
      -- In the sum already: requested now, it leaves it (the caller counts that).
      redis.call('HSET', KEYS[1], page, (requested and 'r' or 'b') .. '0:' .. size)
      old = 'b'
    else
      redis.call('HSET', KEYS[1], page, column .. summed .. ':' .. size)
      if not requested and summed == '1' then
        redis.call('HINCRBY', KEYS[1], '#pages', 1)
        redis.call('HINCRBY', KEYS[1], '#size', size)
      end
      old = ''
    end
  elseif requested and string.sub(old, 1, 1) ~= 'r' then
    -- Counted not requested, requested after all: visited, the store's sum
    -- leaves it out from now on.
    redis.call('HSET', KEYS[1], page, 'r0:' .. size)
    if string.sub(old, 2, 2) == '1' then
      local stored = string.sub(old, string.find(old, ':', 1, true) + 1)
      redis.call('HINCRBY', KEYS[1], '#pages', -1)
      redis.call('HINCRBY', KEYS[1], '#size', -tonumber(stored))
    end
  end
  had[#had + 1] = old
end
return had

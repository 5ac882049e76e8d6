-- Count a page for the run, once: the first worker to count it does.
-- KEYS[1]: the run's counted pages (page -> column, whether the re-seeder's
-- sum counts it too, stored size: "d1:1234"; and the fields #pages, #size:
-- the pages counted not requested that the sum counts, #bulk: set once the
-- re-seeder counts the sum). A page's field holds NUL bytes: no clash.
-- ARGV: page, column (r requested, d not due, s skipped), size, summed (0/1).
-- Returns what the run had: "" nothing (the caller counts it), "b" the
-- re-seeder's sum, else the page's field as it was.
local old = redis.call('HGET', KEYS[1], ARGV[1])
local requested = ARGV[2] == 'r'
if not old then
  if ARGV[4] == '1' and redis.call('HEXISTS', KEYS[1], '#bulk') == 1 then
    -- In the sum already: requested now, it leaves it (the caller counts that).
    redis.call('HSET', KEYS[1], ARGV[1], (requested and 'r' or 'b') .. '0:' .. ARGV[3])
    return 'b'
  end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ARGV[4] .. ':' .. ARGV[3])
  if not requested and ARGV[4] == '1' then
    redis.call('HINCRBY', KEYS[1], '#pages', 1)
    redis.call('HINCRBY', KEYS[1], '#size', ARGV[3])
  end
  return ''
end
if requested and string.sub(old, 1, 1) ~= 'r' then
  -- Counted not requested, requested after all: visited, the store's sum
  -- leaves it out from now on.
  redis.call('HSET', KEYS[1], ARGV[1], 'r0:' .. ARGV[3])
  if string.sub(old, 2, 2) == '1' then
    local size = string.sub(old, string.find(old, ':', 1, true) + 1)
    redis.call('HINCRBY', KEYS[1], '#pages', -1)
    redis.call('HINCRBY', KEYS[1], '#size', -tonumber(size))
  end
end
return old


-- A crawl of the scope starts (it took its hold): its checks, from ARGV[3]
-- (whole seconds) on, are noted one by one (P:ck), so that a summary
-- leaves them out without reading every page. Not if a page was checked
-- at or after that time already (a clock that went back): then no mark,
-- and summaries that need one read every page. ARGV: the key prefix, the
-- scope part, the time. Returns whether the mark is set.
local z = sums_keys(ARGV[1], ARGV[2])
local at = tonumber(ARGV[3])
local meta = redis.call('HMGET', z.meta, 'mark', 'latest')
local mark, latest = tonumber(meta[1]), tonumber(meta[2])
if mark == at then return 1 end
if latest and latest >= at then
  redis.call('HDEL', z.meta, 'mark')
  redis.call('DEL', z.checks)
  return 0
end
redis.call('HSET', z.meta, 'mark', at)
redis.call('ZREMRANGEBYSCORE', z.checks, '-inf', '(' .. at)
return 1

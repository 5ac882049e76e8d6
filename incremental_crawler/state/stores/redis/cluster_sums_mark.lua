
-- sums_mark.lua with its keys declared (the cluster layout): KEYS the
-- nvm and ck of a scope shard (its slot, its host group's {<scope>|<g>}),
-- ARGV the time;
-- run on every shard once the scope's hold is taken.
local z = {meta = KEYS[1], checks = KEYS[2]}
local at = tonumber(ARGV[1])
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

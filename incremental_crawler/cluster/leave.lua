
local back = 0
for _, prefix in ipairs({ARGV[2], ARGV[4]}) do
  local mine = prefix .. ARGV[1]
  for _, v in ipairs(redis.call('HVALS', mine)) do
    local s = string.find(v, '|', 1, true)
    redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
    back = back + 1
  end
  redis.call('DEL', mine)
end
redis.call('HDEL', KEYS[1], ARGV[1])
local unrecorded = tonumber(redis.call('GET', ARGV[3] .. 'unrecorded') or '0')
local ended = 0
if redis.call('HLEN', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3], ARGV[3] .. 'seen', ARGV[3] .. 'unrecorded', ARGV[3] .. 'claims',
             ARGV[3] .. 'tombstones', ARGV[3] .. 'started', ARGV[3] .. 'listings',
             ARGV[3] .. 'decided')
  ended = 1
end
return {back, unrecorded, ended}

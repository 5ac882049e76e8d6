
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local mine = ARGV[3] .. ARGV[1]
local held = ARGV[4] .. ARGV[1]
local nfinished = tonumber(ARGV[5])
for i = 6, 5 + nfinished do
  redis.call('HDEL', mine, ARGV[i])
  redis.call('HDEL', held, ARGV[i])
end
for i = 6 + nfinished, #ARGV do
  local v = redis.call('HGET', mine, ARGV[i])
  if v then
    redis.call('HSET', held, ARGV[i], v)
    redis.call('HDEL', mine, ARGV[i])
  end
end
redis.call('HSET', KEYS[1], ARGV[1], now)
local requeued, dead = 0, 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local w = all[i]
  if w ~= ARGV[1] and now - tonumber(all[i + 1]) > tonumber(ARGV[2]) then
    for _, prefix in ipairs({ARGV[3], ARGV[4]}) do
      for _, v in ipairs(redis.call('HVALS', prefix .. w)) do
        local s = string.find(v, '|', 1, true)
        redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
        requeued = requeued + 1
      end
      redis.call('DEL', prefix .. w)
    end
    redis.call('HDEL', KEYS[1], w)
    dead = dead + 1
  end
end
local busy = 0
local workers = redis.call('HKEYS', KEYS[1])
for _, w in ipairs(workers) do
  if w ~= ARGV[1] and redis.call('HLEN', ARGV[3] .. w) > 0 then busy = busy + 1 end
end
return {redis.call('ZCARD', KEYS[2]), busy, #workers, requeued, dead,
        redis.call('HLEN', mine)}

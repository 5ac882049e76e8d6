local known = {}
for i = 1, #ARGV do known[ARGV[i]] = true end
local back = 0
for _, ticket in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not known[ticket] then
    local v = redis.call('HGET', KEYS[1], ticket)
    local s = string.find(v, '|', 1, true)
    redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
    redis.call('HDEL', KEYS[1], ticket)
    back = back + 1
  end
end
return back

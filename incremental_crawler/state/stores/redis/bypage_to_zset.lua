
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local flat = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
for j = 1, #flat, 2 do
  for _, key in ipairs(cjson.decode(flat[j + 1])) do
    redis.call('ZADD', KEYS[1], 0, flat[j] .. '\0' .. key)
  end
end
return 1


local owner = redis.call('HGET', KEYS[1], ARGV[1])
if not owner or (owner ~= ARGV[2] and redis.call('HEXISTS', KEYS[2], owner) == 0) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  owner = ARGV[2]
end
return owner

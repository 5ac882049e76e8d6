
local out = {}
for n = 1, #ARGV do
  local version = redis.call('HGET', KEYS[3 * n - 1], ARGV[n])
  local entry = false
  if version then entry = redis.call('HGET', KEYS[3 * n], version) end
  out[3 * n - 2] = version
  out[3 * n - 1] = entry
  out[3 * n] = redis.call('HGET', KEYS[3 * n - 2], ARGV[n])
end
return out

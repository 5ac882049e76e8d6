
local prefix = ARGV[1]
local counts = {}
local out = {}
for j = 2, #ARGV, 3 do
  local tag = '{' .. ARGV[j] .. '|' .. ARGV[j + 1] .. '}'
  local n = counts[tag]
  if not n then
    n = bucket_count(prefix .. ':hd:' .. tag)
    counts[tag] = n
  end
  local b = bucket_of(n, ARGV[j + 2])
  local raw = redis.call('HGET', prefix .. ':pg:' .. tag .. ':' .. b, ARGV[j + 2])
  if not raw then raw = redis.call('HGET', prefix .. ':pgl:' .. tag .. ':' .. b, ARGV[j + 2]) end
  out[#out + 1] = raw
end
return out

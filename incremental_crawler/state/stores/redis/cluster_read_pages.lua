
-- Reads pages of one host on a Redis Cluster (cluster layout). KEYS: the host's
-- record (hd), then per bucket declared its two hashes (pg, pgl). ARGV: the
-- bucket count the caller chose the buckets by, then per page its field
-- and the index of its bucket's pair among the declared ones (0 first).
-- Returns per page its record (nil: none); or {'n', count} when the
-- host's bucket count is another (a split moved pages since): the caller
-- asks again with the buckets of that count.
local n = bucket_count(KEYS[1])
if n ~= tonumber(ARGV[1]) then return {'n', n} end
local out = {}
for j = 2, #ARGV, 2 do
  local at = 2 + 2 * tonumber(ARGV[j + 1])
  local raw = redis.call('HGET', KEYS[at], ARGV[j])
  if not raw then raw = redis.call('HGET', KEYS[at + 1], ARGV[j]) end
  out[#out + 1] = raw
end
return out


-- due_read.lua for the buckets of one host on a Redis Cluster (cluster layout):
-- KEYS per bucket its two hashes (pg, pgl); ARGV the time, the cap, then
-- per bucket its member ("host|n") and the next visit its pages were read
-- up to before. Returns the first two strings due_read.lua returns (the
-- count of splits is read from the scope's slot beside it).
local now, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local heads, records = {}, {}
for j = 3, #ARGV, 2 do
  local member, after = ARGV[j], tonumber(ARGV[j + 1])
  local at = j - 2
  local flat = redis.call('HGETALL', KEYS[at])
  local large = redis.call('HGETALL', KEYS[at + 1])
  for k = 1, #large do flat[#flat + 1] = large[k] end
  local above, least = false, false
  local parts = {member, '', ''}
  for k = 1, #flat, 2 do
    local due = due_of(flat[k + 1])
    if due and (not least or due < least) then least = due end
    if due and due <= now and due > after then
      if due <= cap then
        parts[#parts + 1] = string.format('%d', due)
        parts[#parts + 1] = flat[k]
        parts[#parts + 1] = #flat[k + 1]
        records[#records + 1] = flat[k + 1]
      elseif not above or due < above then
        above = due
      end
    end
  end
  if above then parts[2] = string.format('%d', above) end
  if least then parts[3] = string.format('%d', least) end
  heads[#heads + 1] = table.concat(parts, '\255')
end
return {table.concat(heads, '\254'), table.concat(records)}

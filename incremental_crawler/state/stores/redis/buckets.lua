
local function field_hash(field)
  local cut = string.find(field, '\0', 1, true)
  if cut then field = string.sub(field, 1, cut - 1) end
  return tonumber(string.sub(redis.sha1hex(field), 1, 8), 16)
end
local function bucket_level(n)
  local level = 1
  while level * 2 <= n do level = level * 2 end
  return level
end
local function bucket_of(n, field)
  local level = bucket_level(n)
  local hashed = field_hash(field)
  local b = hashed % (2 * level)
  if b >= n then b = hashed % level end
  return b
end
local function bucket_count(dir)
  -- A host's bucket count (1 for a host with none stored yet).
  local stored = redis.call('HGET', dir, 'n')
  if not stored then return 1 end
  local n = tonumber(stored)
  if not n or n < 1 or n ~= math.floor(n) then
    error('the bucket count in ' .. dir .. ' is not a number: ' .. stored, 0)
  end
  return n
end

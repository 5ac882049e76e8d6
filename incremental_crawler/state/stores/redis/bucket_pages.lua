
local function bucket_pages(prefix, tag, b)
  local flat = redis.call('HGETALL', prefix .. ':pg:' .. tag .. ':' .. b)
  local large = redis.call('HGETALL', prefix .. ':pgl:' .. tag .. ':' .. b)
  for k = 1, #large do flat[#flat + 1] = large[k] end
  return flat
end

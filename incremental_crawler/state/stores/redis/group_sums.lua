-- A host group's stored sum ("<pages> <bytes>") added to; a field summing
-- no page goes. Returns false when the stored value or key cannot be added
-- to (damaged by hand: nothing written to it): the caller marks the
-- group's sums lost. Prepended to the group's write and repair scripts
-- (cluster_host.lua, cluster_forget.lua).
local function add_sum(key, field, pages, bytes)
  local value = redis.pcall('HGET', key, field)
  if type(value) == 'table' then return false end
  if value then
    local cut = string.find(value, ' ', 1, true)
    local had_pages = cut and tonumber(string.sub(value, 1, cut - 1))
    local had_bytes = cut and tonumber(string.sub(value, cut + 1))
    if not had_pages or not had_bytes then return false end
    pages, bytes = pages + had_pages, bytes + had_bytes
  end
  if pages == 0 then
    redis.call('HDEL', key, field)
  else
    redis.call('HSET', key, field, string.format('%d %d', pages, bytes))
  end
  return true
end


-- Adds the pages of some buckets to their scope's sums (a migration to
-- layout 4 builds them once). ARGV: the key prefix, the scope part, then
-- per bucket its host part and number.
local prefix, scope = ARGV[1], ARGV[2]
local z = sums_keys(prefix, scope)
local latest = tonumber(redis.call('HGET', z.meta, 'latest'))
local added = 0
for j = 3, #ARGV, 2 do
  local flat = bucket_pages(prefix, '{' .. scope .. '|' .. ARGV[j] .. '}', ARGV[j + 1])
  for k = 2, #flat, 2 do
    local checked = count_page(z, false, flat[k])
    if checked and (not latest or checked > latest) then latest = checked end
    added = added + 1
  end
end
if latest then redis.call('HSET', z.meta, 'latest', latest) end
return added

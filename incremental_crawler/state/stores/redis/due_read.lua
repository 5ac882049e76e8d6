
local prefix, scope = ARGV[1], ARGV[2]
local now, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local heads, records = {}, {}
for j = 5, #ARGV, 2 do
  local member, after = ARGV[j], tonumber(ARGV[j + 1])
  local cut = string.find(member, '|', 1, true)
  local tag = '{' .. scope .. '|' .. string.sub(member, 1, cut - 1) .. '}'
  local flat = bucket_pages(prefix, tag, string.sub(member, cut + 1))
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
local splits = redis.call('GET', prefix .. ':splits:' .. scope) or ''
return {table.concat(heads, '\254'), table.concat(records), splits}

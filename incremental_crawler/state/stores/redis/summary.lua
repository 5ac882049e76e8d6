
local prefix, scope = ARGV[1], ARGV[2]
local after, upto, checked_before = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local excluded = {}
local skip = tonumber(ARGV[6])
for j = 7, 6 + skip do excluded[ARGV[j]] = true end
local due = prefix .. ':dueb:' .. scope
local pages, size, first = 0, 0, false
for j = 7 + skip, #ARGV do
  local member = ARGV[j]
  local cut = string.find(member, '|', 1, true)
  local tag = '{' .. scope .. '|' .. string.sub(member, 1, cut - 1) .. '}'
  local flat = bucket_pages(prefix, tag, string.sub(member, cut + 1))
  local least = false
  for k = 2, #flat, 2 do
    local callback, checked, visit, bytes = page_summary(flat[k])
    if callback then
      if not least or visit < least then least = visit end
      if not excluded[callback] and visit > after and visit <= upto
          and checked < checked_before then
        pages = pages + 1
        size = size + bytes
        if not first or visit < first then first = visit end
      end
    end
  end
  if least then
    redis.call('ZADD', due, 'XX', least, member)
  else
    redis.call('ZREM', due, member)
  end
end
if first then first = string.format('%d', first) end
return {pages, string.format('%d', size), first}

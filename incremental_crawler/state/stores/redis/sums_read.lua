
local prefix, scope = ARGV[1], ARGV[2]
local after, upto, before = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local excluded = {}
local skip = tonumber(ARGV[6])
for j = 7, 6 + skip do excluded[ARGV[j]] = true end
local z = sums_keys(prefix, scope)
local meta = redis.call('HMGET', z.meta, 'mark', 'latest')
local mark, latest = tonumber(meta[1]), tonumber(meta[2])
local pages, size = 0, 0
-- This crawl's checks (last checked at or after `before`) are in the sums:
-- taken out one by one, as far as the scope's checks since its mark say
-- which they are (else the caller reads every page).
local less_minute, less_visit = {}, {}
if latest and before <= latest then
  if not mark or before < mark then return {'scan'} end
  local counts = {}
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', z.checks, before, '+inf')) do
    local cut = string.find(member, '|', 1, true)
    local part, field = string.sub(member, 1, cut - 1), string.sub(member, cut + 1)
    local tag = '{' .. scope .. '|' .. part .. '}'
    local n = counts[tag]
    if not n then
      n = bucket_count(prefix .. ':hd:' .. tag)
      counts[tag] = n
    end
    local b = bucket_of(n, field)
    local raw = redis.call('HGET', prefix .. ':pg:' .. tag .. ':' .. b, field)
    if not raw then raw = redis.call('HGET', prefix .. ':pgl:' .. tag .. ':' .. b, field) end
    if raw then
      local callback, checked, visit, bytes = page_summary(raw)
      if callback and not excluded[callback] and checked >= before and visit > after
          and visit <= upto then
        pages, size = pages - 1, size - bytes
        local minute = math.floor(visit / SUM_MINUTE)
        less_minute[minute] = (less_minute[minute] or 0) + 1
        less_visit[visit] = (less_visit[visit] or 0) + 1
      end
    end
  end
end
local function parse(value)
  local cut = string.find(value, ' ', 1, true)
  return tonumber(string.sub(value, 1, cut - 1)), tonumber(string.sub(value, cut + 1))
end
-- The pages of one minute in range, by next visit (this crawl's checks
-- left out), and their sums.
local function minute_pages(minute)
  local flat = redis.call('HGETALL', z.fine .. minute)
  local by, count, bytes = {}, 0, 0
  for k = 1, #flat, 2 do
    local field = flat[k]
    local cut = string.find(field, '|', 1, true)
    if not excluded[string.sub(field, cut + 1)] then
      local visit = minute * SUM_MINUTE + tonumber(string.sub(field, 1, cut - 1))
      if visit > after and visit <= upto then
        local c, s = parse(flat[k + 1])
        by[visit] = (by[visit] or 0) + c
        count, bytes = count + c, bytes + s
      end
    end
  end
  for visit, less in pairs(less_visit) do
    if by[visit] then by[visit] = by[visit] - less end
  end
  return by, count, bytes
end
local function earliest(by)
  local first = false
  for visit, count in pairs(by) do
    if count > 0 and (not first or visit < first) then first = visit end
  end
  return first
end
-- Minutes wholly in (after, upto]: those between the minutes of its ends.
local low, high = math.floor((after + 1) / SUM_MINUTE), math.floor(upto / SUM_MINUTE)
local low_by, c, s = minute_pages(low)
pages, size = pages + c, size + s
local high_by = {}
if high > low then
  high_by, c, s = minute_pages(high)
  pages, size = pages + c, size + s
end
local net = {}
local flat = redis.call('HGETALL', z.coarse)
for k = 1, #flat, 2 do
  local field = flat[k]
  local cut = string.find(field, '|', 1, true)
  local minute = tonumber(string.sub(field, 1, cut - 1))
  if minute > low and minute < high and not excluded[string.sub(field, cut + 1)] then
    c, s = parse(flat[k + 1])
    pages, size = pages + c, size + s
    net[minute] = (net[minute] or 0) + c
  end
end
for minute, less in pairs(less_minute) do
  if net[minute] then net[minute] = net[minute] - less end
end
local first = earliest(low_by)
if not first then
  local minute = earliest(net)
  if minute then first = earliest((minute_pages(minute))) end
end
if not first then first = earliest(high_by) end
if first then first = string.format('%d', first) end
return {pages, string.format('%d', size), first}

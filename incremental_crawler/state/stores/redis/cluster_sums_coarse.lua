
-- The coarse sums of one scope shard in a window, added up in Redis (a
-- summary on a Redis Cluster, cluster layout): the shard's P:nvs holds one
-- field a minute and callback ("<minute>|<callback>" -> "pages bytes"),
-- thousands of them, which a client would read and parse one by one.
-- KEYS: the shard's nvs. ARGV: the window's least minute and greatest
-- (both left out), the number of callbacks left out and those, then per
-- minute the shard's checks taken out of its sums: minute, pages.
-- Returns {pages, bytes, least}: the pages and bytes of the window, and its
-- earliest minute with more pages than checks taken out ('': none).
-- Read-only (it runs above maxmemory).
local low, high = tonumber(ARGV[1]), tonumber(ARGV[2])
local excluded = {}
local n = tonumber(ARGV[3])
for k = 1, n do excluded[ARGV[3 + k]] = true end
local less = {}
for j = 4 + n, #ARGV - 1, 2 do less[tonumber(ARGV[j])] = tonumber(ARGV[j + 1]) end
local net = {}
local pages, bytes = 0, 0
local flat = redis.call('HGETALL', KEYS[1])
for f = 1, #flat, 2 do
  local field = flat[f]
  local cut = string.find(field, '|', 1, true)
  local minute = cut and tonumber(string.sub(field, 1, cut - 1))
  if minute and low < minute and minute < high and not excluded[string.sub(field, cut + 1)] then
    local value = flat[f + 1]
    local space = string.find(value, ' ', 1, true)
    local count = tonumber(string.sub(value, 1, space - 1))
    pages = pages + count
    bytes = bytes + tonumber(string.sub(value, space + 1))
    net[minute] = (net[minute] or 0) + count
  end
end
local least
for minute, count in pairs(net) do
  if count > (less[minute] or 0) and (not least or minute < least) then least = minute end
end
return {string.format('%.0f', pages), string.format('%.0f', bytes),
        least and string.format('%.0f', least) or ''}


-- summary.lua for the buckets of one host on a Redis Cluster (cluster layout),
-- read-only: the buckets' bounds in the revisit index (the scope's slot)
-- are set by cluster_raise.lua from what this returns.
-- KEYS per bucket its two hashes (pg, pgl); ARGV after, upto,
-- checked_before, the number of callbacks left out, those callbacks.
-- Returns pages, size, earliest next visit (false: none), and per bucket
-- the least next visit of its pages with a callback ('': none), in order.
local after, upto, checked_before = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local excluded = {}
local skip = tonumber(ARGV[4])
for j = 5, 4 + skip do excluded[ARGV[j]] = true end
local pages, size, first = 0, 0, false
local least = {}
for at = 1, #KEYS, 2 do
  local low = false
  for _, key in ipairs({KEYS[at], KEYS[at + 1]}) do
    local flat = redis.call('HGETALL', key)
    for k = 2, #flat, 2 do
      local callback, checked, visit, bytes = page_summary(flat[k])
      if callback then
        if not low or visit < low then low = visit end
        if not excluded[callback] and visit > after and visit <= upto
            and checked < checked_before then
          pages = pages + 1
          size = size + bytes
          if not first or visit < first then first = visit end
        end
      end
    end
  end
  if low then least[#least + 1] = string.format('%d', low) else least[#least + 1] = '' end
end
if first then first = string.format('%d', first) end
return {pages, string.format('%d', size), first or '', table.concat(least, ' ')}

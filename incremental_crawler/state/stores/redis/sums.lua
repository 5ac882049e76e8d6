
-- A scope's pages with a callback in sums by next visit (layout 4): per
-- minute and callback, P:nvs:<s> ("<minute>|<callback>" -> "<pages> <bytes>"),
-- and per second in that minute's hash P:nvf:<s>:<minute> ("<second>|<callback>"
-- -> the same), a field deleted when it sums no page. Kept by every page
-- write (count_page), so that a summary reads sums, not pages. P:nvm:<s>
-- holds the mark (a crawl's start: pages checked since are in P:ck:<s>,
-- "<host part>|<field>" scored by last check) and the latest last check
-- ever written.
local SUM_MINUTE = 60
local function sums_keys(prefix, scope)
  return {coarse = prefix .. ':nvs:' .. scope, fine = prefix .. ':nvf:' .. scope .. ':',
          meta = prefix .. ':nvm:' .. scope, checks = prefix .. ':ck:' .. scope}
end
local function add_sum(key, field, pages, bytes)
  local value = redis.call('HGET', key, field)
  if value then
    local cut = string.find(value, ' ', 1, true)
    pages = pages + tonumber(string.sub(value, 1, cut - 1))
    bytes = bytes + tonumber(string.sub(value, cut + 1))
  end
  if pages == 0 then
    redis.call('HDEL', key, field)
  else
    redis.call('HSET', key, field, string.format('%d %d', pages, bytes))
  end
end
local function add_page(z, callback, visit, bytes, sign)
  local minute = math.floor(visit / SUM_MINUTE)
  add_sum(z.coarse, minute .. '|' .. callback, sign, sign * bytes)
  add_sum(z.fine .. minute, (visit - minute * SUM_MINUTE) .. '|' .. callback, sign,
          sign * bytes)
end
-- A page's record *old* (false: none) becomes *new* (false: none): the sums
-- follow. Returns the new record's last check if it has a callback (nil:
-- none, or no new record).
local function count_page(z, old, new)
  local callback, visit, bytes = nil, 0, 0
  if old then
    local _
    callback, _, visit, bytes = page_summary(old)
  end
  local checked, callback2, visit2, bytes2 = nil, nil, 0, 0
  if new then callback2, checked, visit2, bytes2 = page_summary(new) end
  if not callback2 then checked = nil end
  if callback == callback2 and visit == visit2 and bytes == bytes2 then return checked end
  if callback then add_page(z, callback, visit, bytes, -1) end
  if callback2 then add_page(z, callback2, visit2, bytes2, 1) end
  return checked
end

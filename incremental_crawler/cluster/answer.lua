-- A page's answers, merged for the run as one crawl merges them (see
-- incremental_crawler.change.accounting): whichever worker gets an answer
-- counts what the page's column, and the run's counts of it, lack. KEYS:
-- the run's counted pages (see count_page.lua: the tags of workers are
-- there), the workers hash, the run's workers that left it, (unused) the
-- pages requested in the sum, the run key. ARGV: this worker, its tag, the
-- call's id (unique in the run), then the page's answers field (its field
-- and "a"), the event: an outcome ("new"...), "?<outcome>" (an outcome
-- unless the page has one: a request that got no answer) or "!failed" (a
-- failure recorded: not the outcome "failed"), its run's id (a run no
-- longer current: an error FENCED, nothing written; see fence.lua).
-- The field: "<events>|<counts>|<calls>":
-- - the page's events in the order they came, each "<event>:<tag>" (the
--   worker that got it), ";" between;
-- - what the workers counted of the page, each "<key>:<tag>:<n>": an
--   outcome (n > 0: counted, n < 0: counted replaced) or "!" (a failure:
--   n > 0 counted failed, n < 0 counted recovered);
-- - each worker's last call for the page and its reply ("<call>=<reply>",
--   calls are "<tag>:<n>").
-- A worker killed (neither in the workers hash nor gone with its crawl
-- recorded) took its stats with it: its events and counts are dropped, at
-- any depth (an answer whose replacer, and the replacer's replacer, were
-- killed is the column again). The page's column is its events merged
-- (the strongest success stays; any other answer replaces what came
-- before; "?<outcome>" only when the page has no column yet); it failed
-- if a failure came after its last answer that was not one. The caller
-- counts the difference between that and what the live workers counted:
-- its own answer, and whatever the killed workers' lost counts leave out
-- (so no column of the run's totals stays below zero).
-- The event "" (the worker that ends the run, for a page whose answers a
-- killed worker counted: see ClusterCoordinator.settle_killed) adds none,
-- and keeps the killed workers' answers (nobody asked the page again):
-- only their counts are lost, counted again by the caller.
-- Returns "<outcomes to count>,<outcomes to count replaced>,<failures to
-- count>,<recoveries to count>" (outcomes "+" between). A call run again
-- after its reply was lost (a worker sends only its last one again) gets
-- its first reply, whichever calls of other workers ran in between.
local refused = fenced(KEYS[5], ARGV[6], KEYS[2], ARGV[1])
if refused then return refused end
local me, call, page, event = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
-- The tags of the run's counters, for the worker that ends the run
-- (leave.lua). Looked up, not taken from HSETNX: the re-seeder's marks
-- (#bulk, #deferred) write its #w|<tag> before it counts any page.
redis.call('HSETNX', KEYS[1], '#w|' .. me, ARGV[1])
local tags = redis.call('HGET', KEYS[1], '#tags') or ''
if not string.find(';' .. tags, ';' .. me .. ';', 1, true) then
  redis.call('HSET', KEYS[1], '#tags', tags .. me .. ';')
end
local settling = event == ''
local known = {}
local function kept(tag)
  if known[tag] == nil then
    local w = redis.call('HGET', KEYS[1], '#w|' .. tag)
    known[tag] = w and (redis.call('HEXISTS', KEYS[2], w) == 1
                        or redis.call('SISMEMBER', KEYS[3], w) == 1) or false
  end
  return known[tag]
end
-- The successes, strongest first (accounting.SUCCESSES): a stronger one
-- replaces a weaker; any other answer replaces anything, and is replaced
-- by any success.
local strength = {new = 5, changed = 4, page_changed = 3, unchanged = 2, not_modified = 1}
local function replaces(later, earlier)
  if later == earlier then return false end
  local before, after = strength[earlier] or 0, strength[later] or 0
  return before == 0 or after == 0 or after > before
end
local function split(text, sep)
  local parts = {}
  for part in string.gmatch(text, '[^' .. sep .. ']+') do parts[#parts + 1] = part end
  return parts
end

local events, counts, calls = {}, {}, ''
local field = redis.call('HGET', KEYS[1], page)
if field then
  local bar1 = string.find(field, '|', 1, true)
  local bar2 = string.find(field, '|', bar1 + 1, true)
  calls = string.sub(field, bar2 + 1)
  for _, entry in ipairs(split(calls, ';')) do
    local eq = string.find(entry, '=', 1, true)
    if string.sub(entry, 1, eq - 1) == call then return string.sub(entry, eq + 1) end
  end
  for _, e in ipairs(split(string.sub(field, 1, bar1 - 1), ';')) do
    local at = string.find(e, ':', 1, true)
    local tag = string.sub(e, at + 1)
    if settling or kept(tag) then events[#events + 1] = {string.sub(e, 1, at - 1), tag} end
  end
  for _, c in ipairs(split(string.sub(field, bar1 + 1, bar2 - 1), ';')) do
    local p = split(c, ':')
    -- A killed worker's are lost with its stats.
    if kept(p[2]) then counts[#counts + 1] = {p[1], p[2], tonumber(p[3])} end
  end
end
if not settling then events[#events + 1] = {event, me} end

-- The column, and whether the page failed, from the events kept.
local column, failed = '', false
for _, e in ipairs(events) do
  local ev = e[1]
  if ev == '!failed' then
    failed = true
  else
    local unanswered = string.sub(ev, 1, 1) == '?'
    if unanswered then ev = string.sub(ev, 2) end
    if not (unanswered and column ~= '') then
      if ev ~= 'failed' then failed = false end
      if column == '' or replaces(ev, column) then column = ev end
    end
  end
end

local net = {}
for _, c in ipairs(counts) do net[c[1]] = (net[c[1]] or 0) + c[3] end
local want = {}
if column ~= '' then want[column] = 1 end
if failed then want['!'] = 1 end
local keys = {}
for k in pairs(net) do keys[#keys + 1] = k end
for k in pairs(want) do if net[k] == nil then keys[#keys + 1] = k end end
table.sort(keys)
local counted, replaced, nfailed, nrecovered = {}, {}, 0, 0
local mine = {}
for _, k in ipairs(keys) do
  local diff = (want[k] or 0) - (net[k] or 0)
  if diff ~= 0 then
    mine[k] = diff
    if k == '!' then
      if diff > 0 then nfailed = diff else nrecovered = -diff end
    else
      for _ = 1, math.abs(diff) do
        if diff > 0 then counted[#counted + 1] = k else replaced[#replaced + 1] = k end
      end
    end
  end
end
local reply = table.concat(counted, '+') .. ',' .. table.concat(replaced, '+') .. ','
              .. nfailed .. ',' .. nrecovered

-- The field again: the events and counts kept, this worker's merged.
local out_events, out_counts = {}, {}
for _, e in ipairs(events) do out_events[#out_events + 1] = e[1] .. ':' .. e[2] end
for _, c in ipairs(counts) do
  local n = c[3]
  if c[2] == me and mine[c[1]] then n, mine[c[1]] = n + mine[c[1]], nil end
  if n ~= 0 then out_counts[#out_counts + 1] = c[1] .. ':' .. c[2] .. ':' .. n end
end
for _, k in ipairs(keys) do
  if mine[k] then out_counts[#out_counts + 1] = k .. ':' .. me .. ':' .. mine[k] end
end
-- This worker's last call replaces its previous one.
local prefix = string.sub(call, 1, string.find(call, ':', 1, true))
local kept_calls = {call .. '=' .. reply}
for _, entry in ipairs(split(calls, ';')) do
  if string.sub(entry, 1, #prefix) ~= prefix then kept_calls[#kept_calls + 1] = entry end
end
redis.call('HSET', KEYS[1], page, table.concat(out_events, ';') .. '|'
           .. table.concat(out_counts, ';') .. '|' .. table.concat(kept_calls, ';'))
return reply

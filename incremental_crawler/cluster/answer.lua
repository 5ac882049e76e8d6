-- A page's answers, merged for the run as one crawl merges them (see
-- incremental_crawler.change.accounting): whichever worker gets an answer
-- counts what it changes in the page's column. KEYS: the run's counted
-- pages (see count_page.lua: the tags of workers are there), the workers
-- hash, the run's workers that left it, (unused) the pages requested in
-- the sum, the run key. ARGV: this worker, its tag, the
-- call's id (unique in the run), then the page's answers field (its
-- field and "a"), the event: an outcome ("new"...), "?<outcome>" (an
-- outcome unless the page has one: a request that got no answer) or
-- "!failed" (a failure recorded: not the outcome "failed"), its run's id
-- (a run no longer current: an error FENCED, nothing written; see
-- beat.lua). The field:
-- "<outcome>|<tag>|<replaced>|<its tag>|<failed tag>|<recovered tag>|<its
-- recoverer's tag>|<calls>": the page's column and the worker that counted
-- it, the outcome that worker counted replaced and the worker that had
-- counted that one, the worker that counted its failure (none: it has not
-- failed or it recovered), the worker whose failure was counted recovered
-- and the worker that counted the recovery, then each worker's last call
-- for the page and its reply ("<call>=<reply>", ";" between: calls are
-- "<tag>:<n>"). Returns "<outcome to count>,<outcome it replaced>,<1: a
-- failure to count>,<1: a recovery to count>". A count by a worker killed
-- since is lost: its column goes back to the one it replaced (whose
-- count, and the replaced one's, are the caller's to merge again), or to
-- none; a recovery it counted goes back to the failure. A call run again
-- after its reply was lost (a worker sends only its last one again) gets
-- its first reply, whichever calls of other workers ran in between.
local run = redis.call('GET', KEYS[5])
if not run or string.sub(run, 1, #ARGV[6] + 1) ~= ARGV[6] .. '|' then
  return redis.error_reply('FENCED run ' .. ARGV[6] .. ' is not the current run')
end
local me, call, page, event = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
redis.call('HSET', KEYS[1], '#w|' .. me, ARGV[1])
local function kept(tag)
  local w = redis.call('HGET', KEYS[1], '#w|' .. tag)
  return w and (redis.call('HEXISTS', KEYS[2], w) == 1
                or redis.call('SISMEMBER', KEYS[3], w) == 1)
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

local outcome, otag, prev, ptag, ftag, rftag, rtag, calls = '', '', '', '', '', '', '', ''
local field = redis.call('HGET', KEYS[1], page)
local mine = string.sub(call, 1, string.find(call, ':', 1, true))
if field then
  local parts = {}
  for part in string.gmatch(field .. '|', '([^|]*)|') do parts[#parts + 1] = part end
  outcome, otag, prev, ptag, ftag, rftag, rtag, calls =
    parts[1], parts[2], parts[3], parts[4], parts[5], parts[6], parts[7], parts[8]
  for entry in string.gmatch(calls, '[^;]+') do
    local eq = string.find(entry, '=', 1, true)
    if string.sub(entry, 1, eq - 1) == call then return string.sub(entry, eq + 1) end
  end
  if outcome ~= '' and not kept(otag) then
    -- Its counter's counts are lost, the one it replaced counted still.
    if prev ~= '' and kept(ptag) then outcome, otag = prev, ptag else outcome, otag = '', '' end
    prev, ptag = '', ''
  end
  if ftag ~= '' and not kept(ftag) then ftag = '' end
  if rtag ~= '' and not kept(rtag) then
    -- Its recovery is lost: the failure it recovered is counted again.
    if ftag == '' and kept(rftag) then ftag = rftag end
    rftag, rtag = '', ''
  end
end
local counted, replaced, failed, recovered = '', '', '0', '0'
if event == '!failed' then
  if ftag == '' then ftag, failed = me, '1' end
else
  local o = event
  local unanswered = string.sub(o, 1, 1) == '?'
  if unanswered then o = string.sub(o, 2) end
  if not (unanswered and outcome ~= '') then
    if o ~= 'failed' and ftag ~= '' then
      rftag, rtag, ftag, recovered = ftag, me, '', '1'
    end
    if outcome == '' or replaces(o, outcome) then
      prev, ptag = outcome, (outcome ~= '' and otag or '')
      replaced, outcome, otag, counted = outcome, o, me, o
    end
  end
end
local reply = counted .. ',' .. replaced .. ',' .. failed .. ',' .. recovered
-- This worker's last call replaces its previous one.
local kept_calls = {call .. '=' .. reply}
for entry in string.gmatch(calls, '[^;]+') do
  if string.sub(entry, 1, #mine) ~= mine then kept_calls[#kept_calls + 1] = entry end
end
redis.call('HSET', KEYS[1], page, table.concat({outcome, otag, prev, ptag, ftag, rftag, rtag,
                                                table.concat(kept_calls, ';')}, '|'))
return reply

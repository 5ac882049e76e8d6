-- A page's answers, merged for the run as one crawl merges them (see
-- incremental_crawler.change.accounting): whichever worker gets an answer
-- counts what it changes in the page's column. KEYS: the run's counted
-- pages (see count_page.lua: the tags of workers are there), the workers
-- hash, the run's workers that left it, (unused) the pages requested in
-- the sum, the run key. ARGV: this worker, its tag, the
-- call's id (unique in the run), then the page's answers field (its
-- field and "a"), the event: an outcome ("new"...), "?<outcome>" (an
-- outcome unless the page has one: a request that got no answer) or
-- "failed" (a failure recorded), its run's id (a run no longer current:
-- an error FENCED, nothing written; see beat.lua). The field: "<outcome>|<tag>|<failed
-- tag>|<call>|<reply>": the page's column and the worker that counted it,
-- the worker that counted its failure (none: it has not failed or it
-- recovered), the last call that changed it and its reply. Returns
-- "<outcome to count>,<outcome it replaced>,<1: a failure to count>,<1: a
-- recovery to count>". A column counted by a worker killed since (its
-- counts lost) is the caller's to count; a call run again after its reply
-- was lost gets its first reply.
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

local outcome, otag, ftag = '', '', ''
local field = redis.call('HGET', KEYS[1], page)
if field then
  local parts = {}
  for part in string.gmatch(field .. '|', '([^|]*)|') do parts[#parts + 1] = part end
  if parts[4] == call then return parts[5] end
  outcome, otag, ftag = parts[1], parts[2], parts[3]
  if outcome ~= '' and not kept(otag) then outcome, otag = '', '' end
  if ftag ~= '' and not kept(ftag) then ftag = '' end
end
local counted, replaced, failed, recovered = '', '', '0', '0'
if event == 'failed' then
  if ftag == '' then ftag, failed = me, '1' end
else
  local o = event
  local unanswered = string.sub(o, 1, 1) == '?'
  if unanswered then o = string.sub(o, 2) end
  if not (unanswered and outcome ~= '') then
    if o ~= 'failed' and ftag ~= '' then ftag, recovered = '', '1' end
    if outcome == '' or replaces(o, outcome) then
      replaced, outcome, otag, counted = outcome, o, me, o
    end
  end
end
local reply = counted .. ',' .. replaced .. ',' .. failed .. ',' .. recovered
redis.call('HSET', KEYS[1], page, table.concat({outcome, otag, ftag, call, reply}, '|'))
return reply

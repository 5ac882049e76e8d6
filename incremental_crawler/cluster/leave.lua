-- Leave: what the worker still holds goes back to the queue; the last
-- worker out with the queue drained ends the current run. KEYS: workers,
-- queue, run, this worker's in-flight and held hashes, then the keys of the
-- run the run key named when the caller read it (RUN_KEYS in
-- coordinator.py: seen, unrecorded, claims, tombstones, listings, decided,
-- counted, early, left, requested_in_sum; left: the workers gone with their
-- crawls recorded, count_page.lua keeps what they counted), then this
-- worker's run's ended reply key (below), then, if the run named is not
-- this worker's run, its own run's keys. ARGV: worker, its run's id,
-- what the caller read in the run key ('' for nothing), '1' if this worker
-- was fenced (beat.lua: silent past the TTL) else '0', '1' if it settled
-- the run's killed workers' counts (see below) else '0', then the tags of
-- the workers it settled.
-- Returns {'moved'} if the run key changed since the caller read it
-- (nothing done: it reads it again); {'settle', tags...} if leaving would
-- end the caller's run while workers of it were killed (their tags, see
-- count_page.lua: neither alive nor gone with their crawls recorded) and
-- it did not settle them yet (nothing else done: the run is marked settled
-- by this worker, #settling in counted, which join.lua keeps new workers
-- out of; it counts what their stats took with them,
-- ClusterCoordinator.settle_killed, and leaves again); else
-- {requeued, the run's unrecorded failures, whether the current run ended,
-- then what the worker that ends its own run counts for a re-seeder whose
-- stats died with it: the pages of its sum of the pages not due, their
-- size, the earliest next visit among them, and what that is: 'sum' (the
-- sum it recorded, see count_page.lua), 'left' (it was killed before it
-- recorded its sum: the pages the recorded workers counted leaving that
-- sum, to make up for) or '' (nothing), then the same for the due pages it
-- deferred: their number and 'sum' (#dsum) or 'left' (#dleft|<worker>) or
-- ''}. Unrecorded is -1 (unknown) for a fenced worker (taken for dead: its
-- crawl is not one of the run's) and when the run key names another run:
-- this worker's was abandoned while it was silent (join.lua), and any key
-- of it left is deleted. (No run key: the run ended without this worker,
-- reaped while silent.)
-- The reply of the leave that ended this worker's run, kept under KEYS[16]
-- ("<run>:ended|<worker>") until the caller deletes it once it has it
-- (best effort: a day at most): the run's keys are gone, and a call run again after its
-- reply was lost gets it again (the re-seeder's sum it hands over is
-- nowhere else).
local ended_reply = redis.call('GET', KEYS[16])
if ended_reply then return cjson.decode(ended_reply) end
local run = redis.call('GET', KEYS[3])
if (run or '') ~= ARGV[3] then return {'moved'} end
local own = run and string.sub(run, 1, #ARGV[2] + 1) == ARGV[2] .. '|'
if own and ARGV[4] ~= '1' and ARGV[5] ~= '1'
   and redis.call('HLEN', KEYS[1]) - redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
   and redis.call('ZCARD', KEYS[2]) + redis.call('HLEN', KEYS[4])
       + redis.call('HLEN', KEYS[5]) == 0 then
  -- Leaving ends the run: its killed workers' counts are settled first.
  local killed = {'settle'}
  for tag in string.gmatch(redis.call('HGET', KEYS[12], '#tags') or '', '[^;]+') do
    local w = redis.call('HGET', KEYS[12], '#w|' .. tag)
    if w ~= ARGV[1] and redis.call('SISMEMBER', KEYS[14], w) == 0 then
      killed[#killed + 1] = tag
    end
  end
  if #killed > 1 then
    -- No worker joins the run while it is settled (join.lua waits): one
    -- joining would count the killed workers' pages again, or end the run
    -- later and settle them again.
    redis.call('HSET', KEYS[12], '#settling', ARGV[1])
    return killed
  end
end
if own and ARGV[5] == '1' then
  -- The killed workers settled (ARGV[6...], their tags): their counts are
  -- in this worker's crawl record now, as if they had left.
  for i = 6, #ARGV do
    local w = redis.call('HGET', KEYS[12], '#w|' .. ARGV[i])
    if w then redis.call('SADD', KEYS[14], w) end
  end
  redis.call('HDEL', KEYS[12], '#settling')
end
local back = 0
for _, mine in ipairs({KEYS[4], KEYS[5]}) do
  for _, v in ipairs(redis.call('HVALS', mine)) do
    local s = string.find(v, '|', 1, true)
    redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
    back = back + 1
  end
  redis.call('DEL', mine)
end
redis.call('HDEL', KEYS[1], ARGV[1])
if not own then
  for i = 17, #KEYS do redis.call('UNLINK', KEYS[i]) end
end
local unrecorded = -1
if own and ARGV[4] ~= '1' then
  redis.call('SADD', KEYS[14], ARGV[1])
  unrecorded = tonumber(redis.call('GET', KEYS[7]) or '0')
end
local ended = 0
local pages, size, first_due, taken = 0, 0, '', ''
local deferred, dtaken = 0, ''
-- Whether the crawl of the worker that wrote *mark* (its tag) is not
-- recorded: neither this worker nor one gone with its crawl recorded.
local function not_recorded(mark)
  local tag = own and ARGV[4] ~= '1' and redis.call('HGET', KEYS[12], mark)
  local w = tag and redis.call('HGET', KEYS[12], '#w|' .. tag)
  return w and redis.call('SISMEMBER', KEYS[14], w) == 0
end
if run and redis.call('HLEN', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) == 0 then
  if not_recorded('#deferred') then
    local recorded = redis.call('HGET', KEYS[12], '#dsum')
    if recorded then
      deferred, dtaken = tonumber(recorded), 'sum'
    else
      for _, w in ipairs(redis.call('SMEMBERS', KEYS[14])) do
        deferred = deferred + tonumber(redis.call('HGET', KEYS[12], '#dleft|' .. w) or '0')
      end
      dtaken = 'left'
    end
  end
  if not_recorded('#bulk') then
    -- The re-seeder's crawl is not recorded: its sum is not in the run's totals.
    local sum = redis.call('HGET', KEYS[12], '#sum')
    if sum then
      local a = string.find(sum, '|', 1, true)
      local b = string.find(sum, '|', a + 1, true)
      pages, size = tonumber(string.sub(sum, 1, a - 1)), tonumber(string.sub(sum, a + 1, b - 1))
      first_due, taken = string.sub(sum, b + 1), 'sum'
    else
      for _, w in ipairs(redis.call('SMEMBERS', KEYS[14])) do
        local left = redis.call('HMGET', KEYS[12], '#left|' .. w, '#lsize|' .. w)
        pages = pages + tonumber(left[1] or '0')
        size = size + tonumber(left[2] or '0')
      end
      taken = 'left'
    end
  end
  -- UNLINK: counted holds a field a page (GBs for a large crawl), freed
  -- off the server's main thread.
  redis.call('UNLINK', KEYS[3], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12],
             KEYS[13], KEYS[14], KEYS[15])
  ended = 1
end
local reply = {back, unrecorded, ended, pages, size, first_due, taken, deferred, dtaken}
if ended == 1 and own then redis.call('SET', KEYS[16], cjson.encode(reply), 'EX', 86400) end
return reply

-- Join the current run, or start one. KEYS: run, workers, the new run's
-- unrecorded, then (when the run key named a run) that run's keys (see
-- RUN_KEYS in coordinator.py). ARGV: worker, new run id, this worker's
-- clock, the worker TTL, what the caller read in the run key ('' for
-- nothing). The run key holds "<id>|<start>": the run's start (its first
-- worker's clock) lives and goes with it.
-- A run none of whose workers beat within the TTL (Redis time, as the
-- heartbeat judges) is abandoned: its workers were all killed. A new run
-- starts in its place; the abandoned run's keys are deleted, but for its
-- failures that could not be recorded, carried into the new run (its
-- sitemaps' state is not saved either).
-- Returns {'moved'} if the run key changed since the caller read it
-- (nothing done: it reads it again), else {"<run>|<start>", workers,
-- the abandoned run's id or ''}.
local run = redis.call('GET', KEYS[1])
if (run or '') ~= ARGV[5] then return {'moved'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local abandoned = ''
if run then
  local alive = false
  local beats = redis.call('HGETALL', KEYS[2])
  for i = 2, #beats, 2 do
    if now - tonumber(beats[i]) <= tonumber(ARGV[4]) then alive = true break end
  end
  if not alive then
    abandoned = string.sub(run, 1, string.find(run, '|', 1, true) - 1)
    local unrecorded = redis.call('GET', KEYS[5])
    if unrecorded then redis.call('SET', KEYS[3], unrecorded) end
    for i = 4, #KEYS do redis.call('UNLINK', KEYS[i]) end
    run = nil
  end
end
if not run then
  run = ARGV[2] .. '|' .. ARGV[3]
  redis.call('SET', KEYS[1], run)
end
redis.call('HSET', KEYS[2], ARGV[1], now)
return {run, redis.call('HKEYS', KEYS[2]), abandoned}

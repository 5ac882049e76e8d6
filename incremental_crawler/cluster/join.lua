-- Join the current run, or start one. KEYS: run, workers, the new run's
-- unrecorded, then (when the run key named a run) that run's keys (see
-- RUN_KEYS in coordinator.py) and its abandoned marker
-- ("<run>:abandoned"). ARGV: worker, new run id, this worker's
-- clock, the worker TTL, what the caller read in the run key ('' for
-- nothing). The run key holds "<id>|<start>|<ttl>": the run's start (its
-- first worker's clock) and worker TTL (its first worker's) live and go
-- with it. Every worker of a run must judge silence by the same TTL (one
-- smaller than the others' would take live workers for dead): a worker with
-- another joins nothing.
-- A run none of whose workers beat within the run's TTL (Redis time, as the
-- heartbeat judges) is abandoned: its workers were all killed. A new run
-- starts in its place; the abandoned run's keys are deleted, but for its
-- failures that could not be recorded, carried into the new run (its
-- sitemaps' state is not saved either).
-- Returns {'moved'} if the run key changed since the caller read it
-- (nothing done: it reads it again), {'settling', its worker} if the run's
-- last worker is ending it (nothing done: the caller waits and asks
-- again), {'ttl', the run's TTL} if this
-- worker's TTL is not the live run's (nothing done), else the run key's
-- value, the workers and the abandoned run's id or ''.
local run = redis.call('GET', KEYS[1])
if (run or '') ~= ARGV[5] then return {'moved'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local abandoned = ''
if run then
  -- A run started before its TTL was stored: judged by this worker's.
  local start = string.find(run, '|', 1, true)
  local at = string.find(run, '|', start + 1, true)
  local ttl = at and string.sub(run, at + 1) or ARGV[4]
  local alive = false
  local beats = redis.call('HGETALL', KEYS[2])
  for i = 2, #beats, 2 do
    if now - tonumber(beats[i]) <= tonumber(ttl) then alive = true break end
  end
  if alive and tonumber(ttl) ~= tonumber(ARGV[4]) then return {'ttl', ttl} end
  -- Its last worker settles its killed workers' counts (leave.lua): no
  -- worker joins it meanwhile (it would count their pages again); the
  -- caller waits for the run to end, or its settler to be silent past the
  -- TTL (the run abandoned then).
  local settler = alive and redis.call('HGET', KEYS[10], '#settling')
  local beat = settler and redis.call('HGET', KEYS[2], settler)
  if beat and now - tonumber(beat) <= tonumber(ttl) then return {'settling', settler} end
  if not alive then
    abandoned = string.sub(run, 1, string.find(run, '|', 1, true) - 1)
    local unrecorded = redis.call('GET', KEYS[5])
    if unrecorded then redis.call('SET', KEYS[3], unrecorded) end
    for i = 4, #KEYS - 1 do redis.call('UNLINK', KEYS[i]) end
    -- Marked abandoned for a day: a worker of it fenced meanwhile leaves
    -- later (leave.lua cannot tell this from a run another worker ended)
    -- and keeps its counts in its own crawl record, since no run counts
    -- them again.
    redis.call('SET', KEYS[#KEYS], '1', 'EX', 86400)
    run = nil
  end
end
if not run then
  run = ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4]
  redis.call('SET', KEYS[1], run)
end
redis.call('HSET', KEYS[2], ARGV[1], now)
return {run, redis.call('HKEYS', KEYS[2]), abandoned}

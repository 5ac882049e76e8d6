-- Claim a one-per-run job. KEYS: the run's claims, workers, run. ARGV:
-- job, worker, the worker TTL, its run's id (a run no longer current: an
-- error FENCED, nothing written; see fence.lua). The first to claim a job owns it; a job not done
-- (no job:done) whose owner is dead (its heartbeat older than the TTL by
-- Redis time, or reaped from the workers hash) is taken over by the worker
-- asking. Returns {owner, whether its work is queued (job:done), the dead
-- owner taken over from or false}.
local refused = fenced(KEYS[3], ARGV[4])
if refused then return refused end
local owner = redis.call('HGET', KEYS[1], ARGV[1])
local done = redis.call('HEXISTS', KEYS[1], ARGV[1] .. ':done')
local from = false
if owner and owner ~= ARGV[2] and done == 0 then
  local beat = redis.call('HGET', KEYS[2], owner)
  local t = redis.call('TIME')
  if not beat or tonumber(t[1]) + tonumber(t[2]) / 1e6 - tonumber(beat) > tonumber(ARGV[3]) then
    from = owner
    owner = nil
  end
end
if not owner then
  owner = ARGV[2]
  redis.call('HSET', KEYS[1], ARGV[1], owner)
end
return {owner, done, from}

-- A claimed job queued its work: job:done, if the caller still owns it.
-- KEYS: the run's claims, run. ARGV: job, worker, its run's id (a run no
-- longer current: an error FENCED, nothing written; see fence.lua).
-- Returns 1, or 0 if another worker took the job over (claim.lua: the
-- caller was silent past the TTL, taken for dead; nothing written).
local refused = fenced(KEYS[2], ARGV[3])
if refused then return refused end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1] .. ':done', ARGV[2])
return 1

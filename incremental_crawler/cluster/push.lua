-- Queue a request unless the run has seen it. KEYS: the run's seen set,
-- queue, run; ARGV: fingerprint ('' for none: dont_filter), score, request,
-- the worker's run id (a run no longer current: an error FENCED, nothing
-- written; see fence.lua).
local refused = fenced(KEYS[3], ARGV[4])
if refused then return refused end
if ARGV[1] ~= '' and redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1

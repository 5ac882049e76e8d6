-- Pop the best request into this worker's in-flight hash. KEYS: queue,
-- in-flight hash, run, workers; ARGV: worker, its run's id. A worker whose
-- run is no longer current, or reaped (not in the workers hash: nobody
-- would give back what it pops if it died), pops nothing: an error FENCED.
local refused = fenced(KEYS[3], ARGV[2], KEYS[4], ARGV[1])
if refused then return refused end
local r = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #r == 0 then return false end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 0)
local ticket = redis.sha1hex(r[1])
redis.call('HSET', KEYS[2], ticket, r[2] .. '|' .. r[1])
return {ticket, r[1]}

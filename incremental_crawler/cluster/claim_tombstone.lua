-- Claim a gone page's tombstone for the run: the first worker to ask gets
-- it, unless it died (left the workers hash) before the page was stored,
-- when its request went back to the queue. KEYS: tombstones, workers, run;
-- ARGV: page, this worker, its run's id (a run no longer current: an error
-- FENCED, nothing written; see fence.lua). Returns the owner.
local refused = fenced(KEYS[3], ARGV[3])
if refused then return refused end
local owner = redis.call('HGET', KEYS[1], ARGV[1])
if not owner or (owner ~= ARGV[2] and redis.call('HEXISTS', KEYS[2], owner) == 0) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  owner = ARGV[2]
end
return owner

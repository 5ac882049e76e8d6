-- Claim a gone page's tombstone for the run: the first worker to ask gets
-- it, unless it died (left the workers hash) before the page was stored,
-- when its request went back to the queue. KEYS: tombstones, workers, run;
-- ARGV: page, this worker, its run's id (a run no longer current: an error
-- FENCED, nothing written; see beat.lua). Returns the owner.
local run = redis.call('GET', KEYS[3])
if not run or string.sub(run, 1, #ARGV[3] + 1) ~= ARGV[3] .. '|' then
  return redis.error_reply('FENCED run ' .. ARGV[3] .. ' is not the current run')
end
local owner = redis.call('HGET', KEYS[1], ARGV[1])
if not owner or (owner ~= ARGV[2] and redis.call('HEXISTS', KEYS[2], owner) == 0) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  owner = ARGV[2]
end
return owner

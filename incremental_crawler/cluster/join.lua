-- Join the current run, or start one. KEYS: run, workers. ARGV: worker,
-- new run id, this worker's clock. The run key holds "<id>|<start>": the
-- run's start (its first worker's clock) lives and goes with it.
local run = redis.call('GET', KEYS[1])
if not run then
  run = ARGV[2] .. '|' .. ARGV[3]
  redis.call('SET', KEYS[1], run)
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[2], ARGV[1], tonumber(t[1]) + tonumber(t[2]) / 1e6)
return {run, redis.call('HKEYS', KEYS[2])}

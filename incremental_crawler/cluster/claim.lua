-- KEYS[1]: the run's claims; ARGV: job, worker. The job's owner (the first
-- to claim it), and whether it said its work is queued (job:done).
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return {redis.call('HGET', KEYS[1], ARGV[1]), redis.call('HEXISTS', KEYS[1], ARGV[1] .. ':done')}

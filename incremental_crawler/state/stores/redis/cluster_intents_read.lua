
-- Reads a scope's write-ahead intents on a Redis Cluster (cluster layout) with
-- the time of their node (their scores are that node's time, written by
-- cluster_intent_add.lua): a reader tells their age on that clock.
-- Read-only (it runs above maxmemory). KEYS: the intents' zset.
-- Returns {now, member, score, member, score, ...}.
local flat = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
table.insert(flat, 1, redis.call('TIME')[1])
return flat

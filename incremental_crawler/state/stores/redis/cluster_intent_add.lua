
-- Writes a flush's write-ahead intents on a Redis Cluster (cluster layout):
-- P:fxhosts:{<scope>^<x>} (a scope shard's) lists "<host part>\0<worker>"
-- scored by the time of the intents' own node (not the worker's clock: a reader tells an
-- intent's age on this same clock, see cluster_intent_drop.lua).
-- KEYS: the intents' zset. ARGV: the members. Returns the time written.
local now = tonumber(redis.call('TIME')[1])
for i = 1, #ARGV do redis.call('ZADD', KEYS[1], now, ARGV[i]) end
return now

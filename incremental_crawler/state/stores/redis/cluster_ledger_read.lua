
-- Reads a host group's ledger (P:fx:{<scope>|<group>}) on a Redis Cluster (layout
-- 5) with the time of its own node: an entry's age is told on the clock
-- that wrote its time (cluster_host.lua writes the node's TIME), so that a
-- reader drops the entries the host script would drop (older than
-- _LEDGER_HONOURED, scripts.py: P:fxdone may have forgotten them) whatever
-- the reader's clock.
-- Read-only (it runs above maxmemory). KEYS: the ledger.
-- Returns {now, field, value, field, value, ...}.
local flat = redis.call('HGETALL', KEYS[1])
table.insert(flat, 1, redis.call('TIME')[1])
return flat

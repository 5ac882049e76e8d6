
-- A repair's raise of the write generations (P:wg) of what it deletes: a
-- scope's on one server, each host's on a cluster (one key a call there:
-- one slot). KEYS: the counters. Flagged allow-oom (see scripts.py): a
-- reset is how a full Redis is freed, and runs there; raised with it, no
-- token read before the reset comes back after it.
for _, key in ipairs(KEYS) do redis.call('INCR', key) end
return #KEYS

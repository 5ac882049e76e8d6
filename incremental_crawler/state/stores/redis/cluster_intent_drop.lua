
-- Drops write-ahead intents of a scope on a Redis Cluster (cluster layout):
-- P:fxhosts:{<scope>^<x>} (a scope shard's) lists "<host part>\0<worker>" by when (this node's
-- TIME) that worker last said it was about to write the host (before its
-- phase 2). A reader that applied a host's ledger drops the intents it
-- read as past their deadline, each only while its score is still the one
-- read: a worker that said so again since (a late phase 2 resent, a new
-- flush of that host) keeps its intent.
-- KEYS: the intents' zset. ARGV: member, score pairs (as read).
-- Returns how many were dropped.
local dropped = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return dropped

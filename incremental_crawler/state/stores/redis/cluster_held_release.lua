
-- Lets go of applied tokens held in a scope shard's P:fxheld (see
-- cluster_scope.lua) whose ledger entries are gone: each goes from
-- P:fxheld and is noted anew in its P:fxdone bucket, at this node's time.
-- That is the one rule for a held token: it goes once its entry is known
-- to be gone, never before, and P:fxdone then answers for it for two days
-- more (APPLIED_KEPT), so that a flush that took the entry as expired
-- before it went (cluster_host.lua) finds it applied in its phase 3, not
-- lost. A token not held (let go already) is left as it is.
-- KEYS: the shard's P:fxheld, then per token its P:fxdone bucket (all of
-- the shard's slot). ARGV: the tokens, in the order of their buckets.
-- Returns how many were let go.
for _, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a hash: '
      .. 'no applied token was let go')
  end
end
local now = tonumber(redis.call('TIME')[1])
local released = 0
for k, token in ipairs(ARGV) do
  if redis.call('HDEL', KEYS[1], token) == 1 then
    -- Its field in its bucket: its 16 hex digits after the bucket's 3.
    redis.call('HSET', KEYS[k + 1], string.sub(token, 4, 19), now)
    released = released + 1
  end
end
return released


-- due_index.lua with its keys declared (the cluster layout): KEYS the
-- revisit index of a scope shard and its count of splits (one slot, its
-- host group's {<scope>|<g>});
-- ARGV the least score, the greatest, the offset and count of ZRANGE ...
-- LIMIT. Returns what due_index.lua returns.
local pairs_ = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2], 'BYSCORE', 'LIMIT', ARGV[3],
                          ARGV[4], 'WITHSCORES')
return {table.concat(pairs_, '\255'), redis.call('GET', KEYS[2]) or ''}

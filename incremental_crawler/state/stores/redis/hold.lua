-- A holder's hold on its scope refreshed: only one that is there and has
-- not lapsed (a hold that lapsed is not taken again: a repair may have held
-- the scope, and ended, meanwhile), and only while no live hold it may not
-- hold beside is there: every hold is its holder's alone but cluster
-- workers' (their holders begin with ARGV[4]), which hold the scope
-- together. The check and the write are one step.
-- KEYS[1]: P:holds:<s>
-- ARGV: now, holder, when its hold lapses, the shared holds' prefix
-- Returns nil when refreshed, {other holder, when its hold lapses} when
-- another holds the scope, {} when the hold lapsed or is gone.
local prefix = ARGV[4]
local function shared(name) return string.sub(name, 1, #prefix) == prefix end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES')
local other, lapses, mine = nil, nil, false
for i = 1, #live, 2 do
  local name = live[i]
  if name == ARGV[2] then
    mine = true
  elseif not (shared(ARGV[2]) and shared(name))
      and (other == nil or tonumber(live[i + 1]) > tonumber(lapses)) then
    other, lapses = name, live[i + 1]
  end
end
if other ~= nil then return {other, lapses} end
if not mine then return {} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return nil

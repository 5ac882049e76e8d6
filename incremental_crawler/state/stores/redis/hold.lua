-- A holder's hold on its scope refreshed (taken again if it lapsed), unless
-- a live hold it may not hold beside is there: every hold is its holder's
-- alone but cluster workers' (their holders begin with ARGV[4]), which hold
-- the scope together. The check and the write are one step: a repair that
-- takes the scope over a lapsed hold is never joined by that hold again.
-- KEYS[1]: P:holds:<s>
-- ARGV: now, holder, when its hold lapses, the shared holds' prefix
-- Returns nil when held, else the other holder and when its hold lapses.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local prefix = ARGV[4]
local function shared(name) return string.sub(name, 1, #prefix) == prefix end
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local other, lapses = nil, nil
for i = 1, #live, 2 do
  local name = live[i]
  if name ~= ARGV[2] and not (shared(ARGV[2]) and shared(name))
      and (other == nil or tonumber(live[i + 1]) > tonumber(lapses)) then
    other, lapses = name, live[i + 1]
  end
end
if other ~= nil then return {other, lapses} end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return nil

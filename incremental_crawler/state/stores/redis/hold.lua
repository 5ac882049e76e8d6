-- A scope's holds, judged on this server's clock (TIME), never a caller's:
-- the hosts of a crawl and of a repair may disagree by minutes (a clock
-- ahead, a crawl run under faketime), and a hold is live or lapsed for
-- both alike. Every hold is its holder's alone but cluster workers' (their
-- holders begin with the shared prefix), which hold the scope together.
-- Each step checks and writes at once.
-- The scope's hold epoch counts its takes (a worker's taken beside live
-- workers' excepted: they hold it together): a hold that lapsed is taken
-- again by a refresh only while the epoch is the one of its holder's take,
-- that is when nobody (a repair, a copy, another crawl) took the scope since
-- (a stalled process goes on instead of dropping what it fetched).
-- KEYS[1]: P:holds:<s>; KEYS[2]: P:holdepoch:<s>
-- ARGV: 'take', 'refresh', 'check' or 'read'; holder, ttl (seconds), the shared
-- holds' prefix, the epoch of the holder's take ('' when unknown: a lapsed
-- hold is never taken again); for 'take', the holders whose process is
-- known gone (their live holds are taken over).
--   take: the hold taken (or renewed) unless a live hold it may not hold
--     beside is there;
--   refresh: the hold renewed, only if it is there and has not lapsed (or
--     lapsed with the epoch unmoved), and no live hold it may not hold
--     beside is there;
--   check: as refresh, a live hold not renewed (a flush's check of its
--     writer's hold);
--   read: nothing written.
-- Returns {now, 'held', epoch} when taken or renewed, {now, 'other',
-- holder, when its hold lapses} when another holds the scope, {now,
-- 'lapsed'} when the hold to refresh lapsed or is gone and the scope was
-- taken since; read: {now, 'read', holder, lapses, holder, lapses...} of
-- the live holds. Times are this server's.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_text = string.format('%.6f', now)
local mode, holder = ARGV[1], ARGV[2]
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_text, '+inf', 'WITHSCORES')
if mode == 'read' then
  local out = {now_text, 'read'}
  for i = 1, #live do out[#out + 1] = live[i] end
  return out
end
local prefix = ARGV[4]
local function shared(name) return string.sub(name, 1, #prefix) == prefix end
local gone = {}
if mode == 'take' then
  for i = 6, #ARGV do gone[ARGV[i]] = true end
end
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0')
local other, lapses, mine, beside = nil, nil, false, false
for i = 1, #live, 2 do
  local name = live[i]
  if name == holder then
    mine = true
  elseif not gone[name] and shared(holder) and shared(name) then
    beside = true
  elseif not gone[name] and not (shared(holder) and shared(name))
      and (other == nil or tonumber(live[i + 1]) > tonumber(lapses)) then
    other, lapses = name, live[i + 1]
  end
end
if other ~= nil then return {now_text, 'other', other, lapses} end
if mode ~= 'take' and not mine and (ARGV[5] == '' or tonumber(ARGV[5]) ~= epoch) then
  return {now_text, 'lapsed'}
end
if mode == 'check' and mine then return {now_text, 'held', tostring(epoch)} end
if mode == 'take' and not beside then
  epoch = redis.call('INCR', KEYS[2])
end
-- Lapsed holds go, and those of gone processes; the live ones left are
-- workers holding beside a worker.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_text)
for name in pairs(gone) do redis.call('ZREM', KEYS[1], name) end
-- A check re-taking a lapsed hold keeps it for the ttl a refresh gave.
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], string.format('%.6f', now + ttl), holder)
return {now_text, 'held', tostring(epoch)}

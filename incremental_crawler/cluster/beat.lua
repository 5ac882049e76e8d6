-- Beat. KEYS: workers, queue, run, this worker's in-flight and held
-- hashes, then the in-flight and held hashes of every other worker this
-- worker knows of (pairs, in the order of ARGV after the tickets). ARGV:
-- worker, ttl, its run's id, number of finished tickets, number of tickets
-- to hold, finished tickets..., tickets to hold..., the other workers known.
-- A worker silent past the TTL (its beat older than the TTL by Redis time,
-- or reaped: not in the workers hash), or whose run is no longer the
-- current one (abandoned while it was silent: join.lua), is fenced: the
-- others took it for dead (another worker may have taken over its claims),
-- so it reaps itself as they would: what it holds goes back to the queue,
-- it leaves the workers hash. {'fenced'}: it must stop without writing to
-- the run.
-- A worker of the workers hash whose keys were not given: {workers} (the
-- caller asks again with them; nothing was changed). Else {queued, busy
-- workers, workers, requeued, dead, own in flight, workers left}.
local me = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local run = redis.call('GET', KEYS[3])
local last = redis.call('HGET', KEYS[1], me)
if not run or string.sub(run, 1, #ARGV[3] + 1) ~= ARGV[3] .. '|'
   or not last or now - tonumber(last) > tonumber(ARGV[2]) then
  for _, key in ipairs({KEYS[4], KEYS[5]}) do
    for _, v in ipairs(redis.call('HVALS', key)) do
      local s = string.find(v, '|', 1, true)
      redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
    end
    redis.call('DEL', key)
  end
  redis.call('HDEL', KEYS[1], me)
  return {'fenced'}
end
local nfinished, nhold = tonumber(ARGV[4]), tonumber(ARGV[5])
local first_other = 6 + nfinished + nhold
local keys_of = {}
for i = first_other, #ARGV do
  local k = 6 + 2 * (i - first_other)
  keys_of[ARGV[i]] = {KEYS[k], KEYS[k + 1]}
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= me and not keys_of[all[i]] then return {redis.call('HKEYS', KEYS[1])} end
end
local mine, held = KEYS[4], KEYS[5]
for i = 6, 5 + nfinished do
  redis.call('HDEL', mine, ARGV[i])
  redis.call('HDEL', held, ARGV[i])
end
for i = 6 + nfinished, 5 + nfinished + nhold do
  local v = redis.call('HGET', mine, ARGV[i])
  if v then
    redis.call('HSET', held, ARGV[i], v)
    redis.call('HDEL', mine, ARGV[i])
  end
end
redis.call('HSET', KEYS[1], me, now)
local requeued, dead = 0, 0
for i = 1, #all, 2 do
  local w = all[i]
  if w ~= me and now - tonumber(all[i + 1]) > tonumber(ARGV[2]) then
    for _, key in ipairs(keys_of[w]) do
      for _, v in ipairs(redis.call('HVALS', key)) do
        local s = string.find(v, '|', 1, true)
        redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
        requeued = requeued + 1
      end
      redis.call('DEL', key)
    end
    redis.call('HDEL', KEYS[1], w)
    dead = dead + 1
  end
end
local busy = 0
local workers = redis.call('HKEYS', KEYS[1])
for _, w in ipairs(workers) do
  if w ~= me and redis.call('HLEN', keys_of[w][1]) > 0 then busy = busy + 1 end
end
return {redis.call('ZCARD', KEYS[2]), busy, #workers, requeued, dead,
        redis.call('HLEN', mine), workers}

#!lua
-- The shared budget of one download slot (incremental_crawler.politeness.budget).
--
-- KEYS[1]: the slot's hash. ARGV: op ("acquire" | "report"), want, cap (rate
-- cap from Crawl-delay/DOWNLOAD_DELAY, 0 = none), start_rate, min_rate,
-- max_rate, increase, decrease, soft_decrease, good (healthy answers),
-- hard_seq (0 = none, -1 = a request without a sequence number), soft
-- (count), freeze (seconds), park (seconds), idle ttl, batch share.
-- Returns {granted, first_seq, wait, rate, frozen_for, parked, change, batch};
-- floats as strings (Lua numbers would be truncated to integers).

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op, want, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local start_rate, min_rate, max_rate = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local increase, decrease, soft_decrease = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local good, hard_seq, soft = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local freeze, park = tonumber(ARGV[13]), tonumber(ARGV[14])
local ttl, share = tonumber(ARGV[15]), tonumber(ARGV[16])

local s = redis.call('HMGET', key, 'rate', 'slow', 'healthy', 'sent', 'cut',
                     'tokens', 'ts', 'frozen', 'parked', 'claim')
-- Within the bounds before any signal counts (a per-domain start_rate may be
-- outside them, bounds may have changed since the rate was stored).
local rate = math.min(max_rate, math.max(min_rate, tonumber(s[1]) or start_rate))
local slow = tonumber(s[2]) or 1
local healthy = tonumber(s[3]) or 0
local sent = tonumber(s[4]) or 0
local cut = tonumber(s[5]) or 0
local tokens = tonumber(s[6]) or 1
local ts = tonumber(s[7]) or now
local frozen = tonumber(s[8]) or 0
local parked = tonumber(s[9]) or 0
local claim = tonumber(s[10]) or 0
local change = ''
if parked == 1 and now >= frozen then parked = 0 end

local function effective()
  if cap > 0 and cap < rate then return cap end
  return rate
end

-- Refill at the rate in force since the last call, before it changes; not
-- during a freeze (its end would release a burst).
tokens = tokens + math.max(0, now - math.max(ts, math.min(frozen, now))) * effective()
ts = now

-- Healthy answers: one window of them (rate answers) grows the rate.
for _ = 1, math.min(good, 1000) do
  healthy = healthy + 1
  if healthy >= math.max(1, rate) and rate < max_rate then
    healthy = 0
    if slow == 1 then rate = math.min(max_rate, rate * 2) else rate = math.min(max_rate, rate + increase) end
    change = 'increase'
  end
end
-- Soft errors (a reset, a DNS hiccup) cost a little each.
for _ = 1, math.min(soft, 1000) do
  healthy = 0
  rate = math.max(min_rate, rate * soft_decrease)
  change = 'soft decrease'
end
-- A hard signal cuts once per window: requests granted before the last cut
-- were in flight when it was made, their losses are already paid for.
if hard_seq ~= 0 then
  if hard_seq < 0 then hard_seq = sent end
  healthy = 0
  slow = 0
  if hard_seq > cut then
    cut = sent
    rate = math.max(min_rate, rate * decrease)
    change = 'decrease'
  end
end
-- And after them: a cut stops at min_rate, which a domain's max_rate may be
-- below (INCREMENTAL_THROTTLE_DOMAINS); max_rate wins.
rate = math.min(max_rate, math.max(min_rate, rate))
if freeze > 0 and now + freeze > frozen then
  frozen = now + freeze
  tokens = 1 -- one request when the freeze ends, then the pace
  claim = 0
  change = 'freeze'
end
if park > 0 then
  parked = 1
  frozen = math.max(frozen, now + park)
  change = 'park'
end

local eff = effective()
local batch = math.max(1, math.floor(eff * share))
-- The bucket holds one batch, and the fraction of the next token: a worker
-- that comes back a little late for its token (its sleep, the round trip)
-- does not push every later token back (the rate would drop by that much).
-- Not under a Crawl-delay: that is a gap between any two requests.
if cap > 0 and cap <= rate then
  tokens = math.min(tokens, batch)
else
  tokens = math.min(tokens, batch + 0.999)
end
local granted, first, wait = 0, 0, 0
if op == 'acquire' then
  if parked == 1 or frozen > now then
    wait = frozen - now
  elseif tokens >= 1 then
    granted = math.min(want, math.floor(tokens), batch)
    tokens = tokens - granted
    first = sent + 1
    sent = sent + granted
  else
    -- Workers told to wait are told different times, a token apart, so
    -- that each finds one when it comes back instead of all polling at
    -- once (nothing is reserved: a freeze still stops them).
    -- At most a token behind the next one: a worker that does not come
    -- back must not hold the others off for long.
    local next_token = now + (1 - tokens) / eff
    local ready = math.max(next_token, math.min(claim, next_token + 1 / eff))
    claim = ready + 1 / eff
    wait = ready - now
  end
end

redis.call('HSET', key, 'rate', rate, 'slow', slow, 'healthy', healthy, 'sent', sent,
           'cut', cut, 'tokens', tokens, 'ts', ts, 'frozen', frozen, 'parked', parked,
           'claim', claim)
redis.call('PEXPIRE', key, math.floor(1000 * math.max(ttl, frozen - now)) + 1000)
return {granted, first, string.format('%.6f', wait), string.format('%.6f', rate),
        string.format('%.6f', math.max(0, frozen - now)), parked, change, batch}

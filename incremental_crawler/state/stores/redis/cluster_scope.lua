
-- Phase 3 of a flush on a Redis Cluster (layout 6): the writes of one slot
-- of a scope, sent once every script of phases 1 and 2 succeeded: a scope
-- shard's {<scope>^<x>} (the effects of its hosts' writes), or the scope's
-- own {<scope>} (its own writes; no effects). First what phase 2 returned
-- of its page writes (the effects):
-- the scope's hosts, the revisit index lowered (ZADD LT: a lower bound
-- stays one), the splits count, the sums by next visit and the checks
-- since the mark (ZADD GT: see below); then the scope's own writes in staging order (host
-- trust, crawl records, rates; delivery marks are the item groups': see
-- cluster_items.lua).
--
-- The effects come from phase 2's scripts, each under its own token
-- (its host group's ledger keeps them until they are applied); P:fxdone:<b>
-- (the shard's tokens of bucket b, 4,096 buckets by a token's first three
-- hex digits: each a small hash that Redis keeps a compact listpack, its
-- next 16 hex digits -> when, plus 'trim' -> when it is next trimmed of
-- tokens older than APPLIED_KEPT) notes the tokens whose effects were
-- applied, so that
-- effects sent twice (by their worker and by another that took them from
-- the ledger) are applied once: when any of those sent was applied
-- already, nothing is, and the script answers {'done', tokens...}.
-- P:fxheld (the shard's tokens applied whose ledger entries may still be
-- there, token -> its ledger's key) notes them too, with no trim: a ledger
-- entry a dead worker left applied (its clean-up never sent) reads as
-- applied however long nobody reads the scope. The one rule for a held
-- token: it goes once its entry is known to be gone, and is then noted
-- anew in P:fxdone (cluster_held_release.lua), so that a flush that took
-- the entry before it went still finds it applied for two days more.
--
-- A bucket's bound lowered here drops the mark a summary set on it
-- (P:duer of the shard: the summary raises the bound only while its mark is
-- there, so a page written while it read the bucket keeps the bound low).
--
-- KEYS: the token, dueb, splits, hs, nvs, nvm, ck, duer, fxheld, then every other
-- key named by index in ARGV. ARGV: the number of effects' tokens and per
-- token the token, the index in KEYS of its P:fxdone bucket and the key of
-- its ledger (another slot's: only noted in P:fxheld); the number
-- of sums deltas and per delta
-- its next visit, callback, pages, bytes and the index in KEYS of its
-- minute's nvf hash; the number of checks and per check its member and
-- last check ('': the page has no callback now); the latest last check
-- ('': none); the number of bucket bounds and per bucket its member and
-- bound; the splits made; 1 when some effects were lost (an expired
-- ledger entry's sums and checks dropped: the shard's sums are marked not
-- to be trusted, P:nvm 'lost', and summaries read every page), else 0;
-- the number of new hosts and their parts; then
-- the writes, each its name and ARITY[name] arguments, keys given as
-- their index in KEYS.
-- Returns {applied, replayed (0/1), error ('' none), effects applied
-- (0/1)}: the effects are applied whole before the first write (they
-- cannot fail once the types are checked), or not at all.
local TOKEN, DUE, SPLITS, HOSTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local COARSE, META, CHECKS, MARKS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local HELD = KEYS[9]
local done = redis.call('GET', TOKEN)
if done then
  local kept = cjson.decode(done)
  return {kept[1], 1, kept[2], kept[3]}
end
-- *effects*: 1 when the effects were applied (every check passed).
local function finish(applied, failed, effects)
  redis.call('SET', TOKEN, cjson.encode({applied, failed or '', effects}), 'EX', TOKEN_TTL)
  return {applied, 0, failed or '', effects}
end
local ARITY = {host = 3, crawl = 4, slotrate = 6}
-- Which arguments of each write are keys (indexes in KEYS), with their types.
local KEY_ARGS = {host = {{0, 'hash'}}, crawl = {{0, 'zset'}},
                  slotrate = {{0, 'hash'}, {1, 'zset'}}}
local function check_type(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= want then
    return 'WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. want
      .. ': nothing of the scope was applied'
  end
end

-- The effects, read first (their types checked with the writes').
local bundles, applied_at, ledgers = {}, {}, {}
for k = 1, tonumber(ARGV[1]) do
  bundles[k] = ARGV[3 * k - 1]
  applied_at[k] = KEYS[tonumber(ARGV[3 * k])]
  ledgers[k] = ARGV[3 * k + 1]
end
local j = 2 + 3 * #bundles
local sums = {}
for _ = 1, tonumber(ARGV[j]) do
  sums[#sums + 1] = {tonumber(ARGV[j + 1]), ARGV[j + 2], tonumber(ARGV[j + 3]),
                     tonumber(ARGV[j + 4]), KEYS[tonumber(ARGV[j + 5])]}
  j = j + 5
end
j = j + 1
local checks = {}
for _ = 1, tonumber(ARGV[j]) do
  checks[#checks + 1] = {ARGV[j + 1], ARGV[j + 2]}
  j = j + 2
end
j = j + 1
local latest = tonumber(ARGV[j])
j = j + 1
local bounds = {}
for _ = 1, tonumber(ARGV[j]) do
  bounds[#bounds + 1] = {ARGV[j + 1], ARGV[j + 2]}
  j = j + 2
end
j = j + 1
local splits = tonumber(ARGV[j])
j = j + 1
local lost = ARGV[j] == '1'
j = j + 1
local hosts = {}
for _ = 1, tonumber(ARGV[j]) do
  hosts[#hosts + 1] = ARGV[j + 1]
  j = j + 1
end
local FIRST = j + 1

local failed = check_type(DUE, 'zset') or check_type(SPLITS, 'string')
  or check_type(MARKS, 'hash')
  or check_type(HOSTS, 'set') or check_type(COARSE, 'hash') or check_type(META, 'hash')
  or check_type(CHECKS, 'zset') or check_type(HELD, 'hash')
for _, delta in ipairs(sums) do failed = failed or check_type(delta[5], 'hash') end
for _, bucket in ipairs(applied_at) do failed = failed or check_type(bucket, 'hash') end
local i = FIRST
while not failed and i <= #ARGV do
  local name = ARGV[i]
  if not ARITY[name] then
    failed = 'unknown write ' .. tostring(name)
    break
  end
  for _, pair in ipairs(KEY_ARGS[name]) do
    failed = failed or check_type(KEYS[tonumber(ARGV[i + 1 + pair[1]])], pair[2])
  end
  i = i + 1 + ARITY[name]
end
-- The values the effects add to are numbers (a damaged one fails the
-- scope's script here, before any effect is applied: a script that erred
-- halfway could not be sent again under its token).
local function count_of(key, field)
  local value = redis.call('HGET', key, field)
  if not value then return true end
  local cut = string.find(value, ' ', 1, true)
  return cut and tonumber(string.sub(value, 1, cut - 1)) and tonumber(string.sub(value, cut + 1))
end
for _, delta in ipairs(sums) do
  if failed then break end
  local minute = math.floor(delta[1] / SUM_MINUTE)
  for _, pair in ipairs({{COARSE, minute .. '|' .. delta[2]},
                         {delta[5], (delta[1] - minute * SUM_MINUTE) .. '|' .. delta[2]}}) do
    if not count_of(pair[1], pair[2]) then
      failed = 'the sum ' .. pair[2] .. ' in ' .. pair[1] .. ' is not two numbers: nothing of '
        .. 'the scope was applied'
    end
  end
end
if not failed and splits > 0 then
  local count = redis.call('GET', SPLITS)
  if count and not tonumber(count) then
    failed = SPLITS .. ' is not a number: nothing of the scope was applied'
  end
end
if failed then return finish(0, failed, 0) end
local now = tonumber(redis.call('TIME')[1])
local seen = {}
-- A token's field in its bucket: its 16 hex digits after the bucket's 3.
local function applied_field(token) return string.sub(token, 4, 19) end
for k, bundle in ipairs(bundles) do
  if redis.call('HEXISTS', applied_at[k], applied_field(bundle)) == 1
      or redis.call('HEXISTS', HELD, bundle) == 1 then
    seen[#seen + 1] = bundle
  end
end
if #seen > 0 then return {'done', unpack(seen)} end
for k, bundle in ipairs(bundles) do
  local bucket = applied_at[k]
  local trim = tonumber(redis.call('HGET', bucket, 'trim'))
  if trim and trim <= now then
    -- Hourly at most: the tokens past APPLIED_KEPT go (their ledger
    -- entries are honoured whole only an hour less: see scripts.py,
    -- _LEDGER_HONOURED).
    local flat = redis.call('HGETALL', bucket)
    for f = 1, #flat, 2 do
      if flat[f] ~= 'trim' and tonumber(flat[f + 1]) < now - APPLIED_KEPT then
        redis.call('HDEL', bucket, flat[f])
      end
    end
  end
  if not trim or trim <= now then redis.call('HSET', bucket, 'trim', now + 3600) end
  redis.call('HSET', bucket, applied_field(bundle), now)
  redis.call('HSET', HELD, bundle, ledgers[k])
  -- No TTL: the hourly trim bounds a bucket (a record of tokens applied
  -- that Redis could evict under a volatile-* policy would let an effect
  -- be applied twice; the store refuses those policies besides).
end

-- The sums (as add_sum in sums.lua): a field summing no page goes.
local function add_sum(key, field, pages, bytes)
  local value = redis.call('HGET', key, field)
  if value then
    local cut = string.find(value, ' ', 1, true)
    pages = pages + tonumber(string.sub(value, 1, cut - 1))
    bytes = bytes + tonumber(string.sub(value, cut + 1))
  end
  if pages == 0 then
    redis.call('HDEL', key, field)
  else
    redis.call('HSET', key, field, string.format('%d %d', pages, bytes))
  end
end
for _, delta in ipairs(sums) do
  local visit, callback, pages, bytes, fine = delta[1], delta[2], delta[3], delta[4], delta[5]
  if pages ~= 0 or bytes ~= 0 then
    local minute = math.floor(visit / SUM_MINUTE)
    add_sum(COARSE, minute .. '|' .. callback, pages, bytes)
    add_sum(fine, (visit - minute * SUM_MINUTE) .. '|' .. callback, pages, bytes)
  end
end
-- The checks since the mark only ever raise a page's score (ZADD GT), and
-- a page that lost its callback or was deleted ('') is not removed: the
-- effects of different scripts are applied in separate runs, in any order
-- (a late worker's older check, a repair's entry left in a ledger), and
-- these commute. A member scored higher than its page's last check, or
-- whose page has no callback now, is harmless: a summary reads every
-- page P:ck lists and keeps only those checked since with a callback; a
-- member missing or scored lower would not be. (P:ck stays bounded: the
-- next mark drops every member scored before it.)
local mark = tonumber(redis.call('HGET', META, 'mark'))
if mark then
  for _, check in ipairs(checks) do
    local at = tonumber(check[2])
    if at and at >= mark then redis.call('ZADD', CHECKS, 'GT', at, check[1]) end
  end
end
if latest then
  local was = tonumber(redis.call('HGET', META, 'latest'))
  if not was or latest > was then redis.call('HSET', META, 'latest', latest) end
end
for _, bound in ipairs(bounds) do
  redis.call('ZADD', DUE, 'LT', bound[2], bound[1])
  redis.call('HDEL', MARKS, bound[1])
end
if splits > 0 then redis.call('INCRBY', SPLITS, splits) end
if lost then redis.call('HSET', META, 'lost', now) end
if #hosts > 0 then redis.call('SADD', HOSTS, unpack(hosts)) end

local OPS = {}
local function key(a, i) return KEYS[tonumber(a[i])] end
function OPS.host(a, i)
  redis.call('HSET', key(a, i), a[i + 1], a[i + 2])
end
function OPS.crawl(a, i)
  local crawls = key(a, i)
  redis.call('ZADD', crawls, a[i + 1], a[i + 2])
  redis.call('ZREMRANGEBYRANK', crawls, 0, -1 - tonumber(a[i + 3]))
end
function OPS.slotrate(a, i)
  local rates, recency = key(a, i), key(a, i + 1)
  redis.call('HSET', rates, a[i + 2], a[i + 3])
  redis.call('ZADD', recency, a[i + 4], a[i + 2])
  local over = redis.call('ZCARD', recency) - tonumber(a[i + 5])
  if over > 0 then
    local old = redis.call('ZRANGE', recency, 0, over - 1)
    redis.call('HDEL', rates, unpack(old))
    redis.call('ZREMRANGEBYRANK', recency, 0, over - 1)
  end
end
local applied = 0
i = FIRST
while i <= #ARGV do
  local name = ARGV[i]
  local ok, err = pcall(OPS[name], ARGV, i + 1)
  if not ok then
    if type(err) == 'table' then err = err.err end
    failed = tostring(err)
    break
  end
  applied = applied + 1
  i = i + 1 + ARITY[name]
end
return finish(applied, failed, 1)

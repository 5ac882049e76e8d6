
-- Phase 3 of a flush on a Redis Cluster (cluster layout): the scope's own
-- writes in its slot {<scope>}, in staging order (host trust, crawl
-- records, rates; delivery marks are the item groups': see
-- cluster_items.lua), sent once every script of phases 1 and 2
-- succeeded. (What a page write changes of the scope's revisit index,
-- sums, checks and hosts is its host group's script's since layout 8:
-- cluster_host.lua.) Kept under its token with the count of writes
-- applied, so that a script sent again after its reply was lost applies
-- nothing twice and returns the same.
--
-- KEYS: the token, then every key named by index in ARGV. ARGV: the
-- writes, each its name and ARITY[name] arguments, keys given as their
-- index in KEYS.
-- Returns {applied, replayed (0/1), error ('' none)}: a damaged key
-- (checked before any write) fails the script whole.
local TOKEN = KEYS[1]
local done = redis.call('GET', TOKEN)
if done then
  local kept = cjson.decode(done)
  return {kept[1], 1, kept[2]}
end
local function finish(applied, failed)
  redis.call('SET', TOKEN, cjson.encode({applied, failed or ''}), 'EX', TOKEN_TTL)
  return {applied, 0, failed or ''}
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

local failed = nil
local i = 1
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
if failed then return finish(0, failed) end

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
i = 1
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
return finish(applied, failed)

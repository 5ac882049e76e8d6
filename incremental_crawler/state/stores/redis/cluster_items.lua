
-- Phase 1 of a flush on a Redis Cluster (cluster layout): the item writes of one
-- item group {<scope>#<g>}, in staging order (an item's writes all fall in
-- its group: its record, version number, place in the export order and
-- history). The page index P:bypage is kept by the phases around it: an
-- item's new member is added by phase 2 (after its item is written), and
-- the members this script makes stale are returned, for phase 3.
--
-- KEYS: the token, the group's items, itemver and order keys, then each
-- write's history key in order. ARGV: the writes, each 8 arguments: item
-- key, record, when, history entry ('': none), change, page ('': none, or
-- the item key), live ('1', '0': a tombstone), versions kept (0: all).
-- Returns {applied, replayed (0/1), error ('' none), effects (JSON: the
-- version each applied write got, and the page index members to remove,
-- each with the version of the write that made it stale: its removal is
-- skipped where a later version wrote the member since)}.
local TOKEN, ITEMS, ITEMVER, ORDER = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local done = redis.call('GET', TOKEN)
if done then
  local kept = cjson.decode(done)
  return {kept[1], 1, kept[2], kept[3]}
end
local function finish(applied, failed, effects)
  redis.call('SET', TOKEN, cjson.encode({applied, failed or '', effects}), 'EX', TOKEN_TTL)
  return {applied, 0, failed or '', effects}
end
local function check_type(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= want then
    return 'WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. want
      .. ': nothing of the item group was applied'
  end
end
local failed = check_type(ITEMS, 'hash') or check_type(ITEMVER, 'hash')
  or check_type(ORDER, 'zset')
for k = 5, #KEYS do failed = failed or check_type(KEYS[k], 'hash') end
if failed then return finish(0, failed, '{}') end

local VERSIONS, REMOVE = {}, {}
local function item(a, i, hist)
  local key, record, when, entry = a[i], a[i + 1], tonumber(a[i + 2]), a[i + 3]
  local live = a[i + 6] == '1'
  local was, now = false, false
  local born, died = when, nil
  local raw = redis.call('HGET', ITEMS, key)
  if raw then
    local old = cjson.decode(raw)
    if type(old.page) == 'string' and old.fingerprint ~= '' then was = old.page end
    if old.fingerprint ~= '' then born = old.born end
    died = old.died
  end
  if live then
    if a[i + 5] ~= '' then now = a[i + 5] end
  else
    born, died = nil, when
  end
  local version = 1
  local stored = redis.call('HGET', ITEMVER, key)
  if stored then
    local number = tonumber(stored)
    if not number or number < 0 or number ~= math.floor(number) then
      error('the version of ' .. key .. ' in ' .. ITEMVER .. ' is not a number: ' .. stored, 0)
    end
    version = number + 1
  end
  local prune = {}
  if entry ~= '' then
    local implied = 'changed'
    if version == 1 then implied = 'new' end
    if a[i + 4] ~= implied then
      entry = '{"change":' .. cjson.encode(a[i + 4]) .. ',' .. string.sub(entry, 2)
    end
    local oldest = version - tonumber(a[i + 7])
    if oldest < version and oldest >= 1 then
      for _, field in ipairs(redis.call('HKEYS', hist)) do
        local number = tonumber(field)
        if not number then
          error('version ' .. field .. ' in ' .. hist .. ' is not a number', 0)
        end
        if number <= oldest then prune[#prune + 1] = field end
      end
    end
  end
  local marks = ''
  if born then marks = marks .. ',"born":' .. string.format('%d', born) end
  if died then marks = marks .. ',"died":' .. string.format('%d', died) end
  if marks ~= '' then record = string.sub(record, 1, -2) .. marks .. '}' end

  if was ~= now then
    -- Netted over the group's writes: a member added by a later write
    -- (phase 2 adds every live one) is not removed.
    if was then REMOVE[was .. '\0' .. key] = version end
  end
  if now then REMOVE[now .. '\0' .. key] = nil end
  redis.call('HSET', ITEMVER, key, version)
  redis.call('HSET', ITEMS, key, record)
  redis.call('ZADD', ORDER, 'NX', when, key)
  if entry ~= '' then
    redis.call('HSET', hist, version, entry)
    for _, field in ipairs(prune) do redis.call('HDEL', hist, field) end
  end
  return version
end

local applied = 0
local i, k = 1, 5
while i <= #ARGV do
  local ok, version = pcall(item, ARGV, i, KEYS[k])
  if not ok then
    if type(version) == 'table' then version = version.err end
    failed = tostring(version)
    break
  end
  applied = applied + 1
  VERSIONS[applied] = version
  i, k = i + 8, k + 1
end
local remove = {}
for member, version in pairs(REMOVE) do remove[#remove + 1] = {member, version} end
return finish(applied, failed, cjson.encode({versions = VERSIONS, remove = remove}))

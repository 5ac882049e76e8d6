
-- Phase 1 of a flush on a Redis Cluster (cluster layout): the item writes of one
-- item group {<scope>#<g>}, in staging order (an item's writes all fall in
-- its group: its record, version number, place in the export order and
-- history), with their delivery marks. The page index P:bypage is kept by
-- the phases around it: an item's new member is added by phase 2 (after
-- its item is written), and the members this script makes stale are
-- returned, for phase 3.
--
-- Delivery marks (see StateStore.stage_delivered) are kept here, in the
-- item's group, so that a version and the mark it waits on are written by
-- one script: P:undel:{<s>#<g>}:<crawl>, a sorted set of members stored_at
-- NUL key NUL version, zero-padded, all of score 0 (lexical order is the
-- order versions were stored in), and P:undelc:{<s>#<g>}, the set of the
-- crawls with such a set in the group.
--
-- KEYS: the token, the group's items, itemver, order and undelc keys, then
-- the keys the writes name by their index in KEYS. ARGV: the writes, each
-- its name then its arguments:
--   item, 11 arguments: the index of its history key, item key, record,
--     when, history entry ('': none), change, page ('': none, or the item
--     key), live ('1', '0': a tombstone), versions kept (0: all), then the
--     crawl the new version waits on ('': none) and the index of that
--     crawl's P:undel key of the group (0: none);
--   redeliv, 4 arguments: the indexes of the P:undel keys of the crawl a
--     version waited on and of the crawl it waits on now, that crawl, the
--     member: moved, if still there;
--   undeliv, 4 arguments: the index of a crawl's P:undel key, the crawl,
--     an item key, when: the item's latest version waits on the crawl (a
--     mark whose item write is not in this script; the caller sends each
--     mark with its write, so only as a safeguard).
-- Returns {applied, replayed (0/1), error ('' none), effects (JSON: the
-- version each applied item write got (0 for another write), and the page
-- index members to remove, each with the version of the write that made
-- it stale: its removal is skipped where a later version wrote the member
-- since)}.
local TOKEN, ITEMS, ITEMVER, ORDER, UNDELC = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
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
local ARITY = {item = 11, redeliv = 4, undeliv = 4}
local failed = check_type(ITEMS, 'hash') or check_type(ITEMVER, 'hash')
  or check_type(ORDER, 'zset') or check_type(UNDELC, 'set')
do
  -- Every key a write names, checked before any write (a history key is a
  -- hash, a crawl's marks a sorted set): nothing applied when one is not.
  local want, i = {}, 1
  while i <= #ARGV and not failed do
    local name = ARGV[i]
    if not ARITY[name] then
      failed = 'unknown write ' .. tostring(name) .. ': nothing of the item group was applied'
      break
    end
    if name == 'item' then
      want[tonumber(ARGV[i + 1])] = 'hash'
      if ARGV[i + 10] ~= '' then want[tonumber(ARGV[i + 11])] = 'zset' end
    elseif name == 'redeliv' then
      want[tonumber(ARGV[i + 1])] = 'zset'
      want[tonumber(ARGV[i + 2])] = 'zset'
    else
      want[tonumber(ARGV[i + 1])] = 'zset'
    end
    i = i + 1 + ARITY[name]
  end
  for k, kind in pairs(want) do failed = failed or check_type(KEYS[k], kind) end
end
if failed then return finish(0, failed, '{}') end

local VERSIONS, REMOVE = {}, {}
local function item(a, i)
  local hist = KEYS[tonumber(a[i])]
  i = i + 1
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
  if a[i + 8] ~= '' then
    -- The delivery mark: the version just written waits on its crawl.
    redis.call('ZADD', KEYS[tonumber(a[i + 9])], 0, string.format('%015d', when) .. '\0'
      .. key .. '\0' .. string.format('%010d', version))
    redis.call('SADD', UNDELC, a[i + 8])
  end
  return version
end
local function redeliv(a, i)
  local from, to, crawl, member = KEYS[tonumber(a[i])], KEYS[tonumber(a[i + 1])], a[i + 2], a[i + 3]
  if redis.call('ZREM', from, member) == 1 then
    redis.call('ZADD', to, 0, member)
    redis.call('SADD', UNDELC, crawl)
  end
  return 0
end
local function undeliv(a, i)
  local version = tonumber(redis.call('HGET', ITEMVER, a[i + 2]))
  if not version then return 0 end
  redis.call('ZADD', KEYS[tonumber(a[i])], 0, string.format('%015d', tonumber(a[i + 3])) .. '\0'
    .. a[i + 2] .. '\0' .. string.format('%010d', version))
  redis.call('SADD', UNDELC, a[i + 1])
  return 0
end
local WRITES = {item = item, redeliv = redeliv, undeliv = undeliv}

local applied = 0
local i = 1
while i <= #ARGV do
  local name = ARGV[i]
  local ok, version = pcall(WRITES[name], ARGV, i + 1)
  if not ok then
    if type(version) == 'table' then version = version.err end
    failed = tostring(version)
    break
  end
  applied = applied + 1
  VERSIONS[applied] = version
  i = i + 1 + ARITY[name]
end
local remove = {}
for member, version in pairs(REMOVE) do remove[#remove + 1] = {member, version} end
return finish(applied, failed, cjson.encode({versions = VERSIONS, remove = remove}))

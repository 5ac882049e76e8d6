
-- Phase 2 of a flush on a Redis Cluster (cluster layout): the page and links
-- writes of one host, in staging order; every key it touches is in KEYS
-- and carries the host's tag {<scope>|<host>}. What such a write changes
-- in keys of the scope's slot (the scope's hosts, the revisit index, the
-- sums by next visit, the checks since the mark, the splits count) is not
-- written here but returned as effects, for the scope's script of phase 3;
-- they are kept under the token with the count of writes applied, so that
-- a script sent again after its reply was lost returns the same effects
-- and applies nothing twice.
--
-- The effects are also kept in the host's ledger (P:fx:{<scope>|<host>},
-- token -> [time, effects]) until the scope's script has applied them (the
-- caller deletes them then): a worker that dies before its phase 3 leaves
-- them there, and the next flush that writes the host takes those older
-- than the age given (the scope's script applies each token's effects
-- once, whoever sends them).
--
-- KEYS: the token, the host's record (hd), its links hash (ln), its
-- ledger, its write generation (wg: raised once if a page state or links
-- record was written or deleted), then per bucket declared its two hashes
-- (pg, pgl). ARGV: the server's hash-max-listpack-value, the bucket count
-- the caller planned from, the splits it planned, the age (seconds) past which another
-- flush's effects in the ledger are taken, the number of buckets declared
-- and their numbers, the deadline of the flush's write-ahead intent (0:
-- none; past it on this node's clock the script writes nothing and says
-- {'late'}: see cluster.py, _phase_hosts), the host's key part, then the
-- writes: each its name
-- and ARITY[name] arguments, a page's field first.
-- Returns {applied, replayed (0/1), error ('' none), effects (JSON),
-- effects taken from the ledger (JSON: [token, effects, expired] triples,
-- expired true for an entry older than LEDGER_HONOURED: only its idempotent
-- parts are applied, see cluster.py, _Effects.expired)}, or
-- {'late'} (see DEADLINE), or
-- {'n', count} when the host's bucket count is not the one planned from,
-- or {'blocked', splits} when only that many of the planned splits can be
-- made (a bucket's key beyond the count is taken): nothing written then.
local TOKEN, DIR, LINKS, LEDGER, GENERATION = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local done = redis.call('GET', TOKEN)
if done then
  local kept = cjson.decode(done)
  return {kept[1], 1, kept[2], kept[3], '[]'}
end
local LISTPACK_VALUE, PLANNED_N = tonumber(ARGV[1]), tonumber(ARGV[2])
local SPLITS, ADOPT_AFTER, DECLARED = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local BUCKETS = {}
for k = 0, DECLARED - 1 do
  BUCKETS[tonumber(ARGV[6 + k])] = {KEYS[6 + 2 * k], KEYS[7 + 2 * k]}
end
local DEADLINE = tonumber(ARGV[6 + DECLARED])
local PART = ARGV[7 + DECLARED]
local FIRST = 8 + DECLARED
-- A reader may drop the intent once it is past its deadline (by more than
-- the nodes' clocks differ): a ledger entry written after that would be
-- listed by no intent. The caller writes its intent again and resends.
if DEADLINE > 0 and tonumber(redis.call('TIME')[1]) > DEADLINE then return {'late'} end
local ARITY = {page = 3, check = 8, failure = 7, redirect = 5, links = 2, unlink = 1,
               flags = 2, listing = 2, postpone = 3}
local function bucket_keys(b)
  local names = BUCKETS[b]
  if not names then error('bucket ' .. b .. ' of ' .. DIR .. ' was not declared', 0) end
  return names[1], names[2]
end

local function finish(applied, failed, effects, taken)
  local value = cjson.encode({applied, failed or '', effects})
  redis.call('SET', TOKEN, value, 'EX', TOKEN_TTL)
  return {applied, 0, failed or '', effects, taken or '[]'}
end

-- The record's type first: the count is read from it.
local dir_type = redis.call('TYPE', DIR).ok
if dir_type ~= 'none' and dir_type ~= 'hash' then
  return finish(0, 'WRONGTYPE ' .. DIR .. ' is a ' .. dir_type .. ', not a hash: nothing of '
    .. 'the host was applied', '{}')
end
local ok, n = pcall(bucket_count, DIR)
if not ok then
  if type(n) == 'table' then n = n.err end
  return finish(0, tostring(n), '{}')
end
if n ~= PLANNED_N then return {'n', n} end
-- Every planned split possible? Checked before anything is written.
for s = 0, SPLITS - 1 do
  local at = n + s
  local level = bucket_level(at)
  local from_small, from_large = bucket_keys(at - level)
  local to_small, to_large = bucket_keys(at)
  for _, key in ipairs({from_small, from_large}) do
    local kind = redis.call('TYPE', key).ok
    if kind ~= 'none' and kind ~= 'hash' then return {'blocked', s} end
  end
  if redis.call('EXISTS', to_small) == 1 or redis.call('EXISTS', to_large) == 1 then
    return {'blocked', s}
  end
end
-- Every key the writes touch is of its type (or absent): a damaged key
-- fails the host's writes whole.
local final_n = n + SPLITS
local function check_type(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= want then
    return 'WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. want
      .. ': nothing of the host was applied'
  end
end
-- The write generation is raised after the writes: INCR must not fail then.
local function check_counter(key)
  local kind = redis.call('TYPE', key).ok
  -- What INCR takes, and can raise without overflowing.
  local v = kind == 'string' and redis.call('GET', key)
  if kind == 'none' or (v and (v == '0' or (string.match(v, '^%-?[1-9]%d*$') and #v <= 18))) then
    return
  end
  return key .. ' is not a counter (a ' .. kind .. '): nothing of the host was applied'
end
do
  local failed = check_type(LINKS, 'hash') or check_type(LEDGER, 'hash')
    or check_counter(GENERATION)
  local i = FIRST
  while not failed and i <= #ARGV do
    local name = ARGV[i]
    if not ARITY[name] then
      failed = 'unknown write ' .. tostring(name)
      break
    end
    if name ~= 'links' and name ~= 'unlink' then
      local okb, small, large = pcall(bucket_keys, bucket_of(final_n, ARGV[i + 1]))
      if not okb then
        failed = tostring(small)
        break
      end
      failed = check_type(small, 'hash') or check_type(large, 'hash')
    end
    i = i + 1 + ARITY[name]
  end
  if failed then return finish(0, failed, '{}') end
end

-- What the scope's slot is to get (phase 3): sums deltas by
-- "<visit>|<callback>" -> {pages, bytes}; the last check of each page
-- written ("<host part>|<field>" -> time, false: no callback); the least
-- next visit of each bucket written ("<host part>|<n>"); splits made;
-- whether the host is to be in its scope's hosts (new_host: whenever its
-- record or links are written, not only when its record is new: a host
-- whose first flush died before its phase 3, its ledger entry dropped,
-- is listed again by its next write); the latest last check written.
local SUMS, CHECKS, DUE = {}, {}, {}
local splits, new_host, latest = 0, false, false
local function lower_due(b, visit)
  local member = PART .. '|' .. b
  visit = tonumber(visit)
  if not DUE[member] or visit < DUE[member] then DUE[member] = visit end
end
local function sum(callback, visit, bytes, sign)
  local field = string.format('%d', visit) .. '|' .. callback
  local was = SUMS[field] or {0, 0}
  SUMS[field] = {was[1] + sign, was[2] + sign * bytes}
end

-- Splits, as layout 4's flush makes them (linear hashing); the new bounds
-- of both buckets only lower the index (phase 3's ZADD LT): a lower bound
-- stays one, and a reader sets a stale one right.
for _ = 1, SPLITS do
  local level = bucket_level(n)
  local source = n - level
  local least = {}
  local from_small, from_large = bucket_keys(source)
  local to_small, to_large = bucket_keys(n)
  for _, pair in ipairs({{from_small, to_small}, {from_large, to_large}}) do
    local from, to = pair[1], pair[2]
    local flat = redis.call('HGETALL', from)
    for k = 1, #flat, 2 do
      local field, raw = flat[k], flat[k + 1]
      local target = source
      if field_hash(field) % (2 * level) == n then
        redis.call('HSET', to, field, raw)
        redis.call('HDEL', from, field)
        target = n
      end
      local okd, due = pcall(due_of, raw)
      if okd and due and (not least[target] or due < least[target]) then least[target] = due end
    end
  end
  for b, visit in pairs(least) do lower_due(b, visit) end
  n = n + 1
  splits = splits + 1
  redis.call('HSET', DIR, 'n', n)
  -- (A host that splits has pages: listed in its scope, as a split of
  -- layout 4 lists it.)
  new_host = true
end

-- Whether a page state or links record of the host was written or deleted:
-- its write generation is raised once, at the end (one INCR a script, not
-- a page: StateStore.write_generation).
local wrote = false
local listed = false
local function register()
  if not listed then
    redis.call('HSETNX', DIR, 'n', n)
    -- (SADD in phase 3: listed again costs nothing.)
    new_host = true
    listed = true
  end
end
local function read_page(field)
  local small, large = bucket_keys(bucket_of(n, field))
  return redis.call('HGET', small, field) or redis.call('HGET', large, field)
end
local function store_page(field, record, old)
  register()
  wrote = true
  if old == nil then old = read_page(field) or false end
  local into, other = bucket_keys(bucket_of(n, field))
  if #field > LISTPACK_VALUE or #record > LISTPACK_VALUE then into, other = other, into end
  local moved = redis.call('HDEL', other, field)
  if redis.call('HSET', into, field, record) == 1 and moved == 0 then
    redis.call('HINCRBY', DIR, 'p', 1)
  end
  -- The sums follow the record (as count_page in sums.lua).
  local callback, visit, bytes = nil, 0, 0
  if old then
    local _
    callback, _, visit, bytes = page_summary(old)
  end
  local callback2, checked, visit2, bytes2 = page_summary(record)
  if callback ~= callback2 or visit ~= visit2 or bytes ~= bytes2 then
    if callback then sum(callback, visit, bytes, -1) end
    if callback2 then sum(callback2, visit2, bytes2, 1) end
  end
  if callback2 then
    CHECKS[PART .. '|' .. field] = checked
    if not latest or checked > latest then latest = checked end
  else
    CHECKS[PART .. '|' .. field] = false
  end
end
local function reindex(field, page)
  if page_callback(page) then lower_due(bucket_of(n, field), page.next_visit or 0) end
end
local OPS = {}
function OPS.page(a, i)
  store_page(a[i], a[i + 1])
  if a[i + 2] ~= '' then lower_due(bucket_of(n, a[i]), a[i + 2]) end
end
local function visit(a, i)
  local raw = read_page(a[i])
  local page
  if raw then
    page = unpack_page(raw)
    page.checks = (page.checks or 0) + 1
  else
    page = {first_seen = tonumber(a[i + 2]), checks = 1}
  end
  page.last_status = tonumber(a[i + 1])
  page.last_checked = tonumber(a[i + 2])
  return page, raw or false
end
function OPS.check(a, i)
  local page, raw = visit(a, i)
  page.failures = nil
  if a[i + 3] ~= '' then page.lastmod = tonumber(a[i + 3]) end
  if a[i + 6] ~= '' then
    page['etag@hex'] = nil
    page.etag = a[i + 6]
  end
  if a[i + 7] ~= '' then
    page['last_modified@date'] = nil
    page.last_modified = a[i + 7]
  end
  local schedule = a[i + 4] ~= ''
  if schedule then
    page.interval = tonumber(a[i + 4])
    page.next_visit = tonumber(a[i + 5])
  end
  store_page(a[i], pack_page(page), raw)
  if schedule then reindex(a[i], page) end
end
function OPS.failure(a, i)
  local page, raw = visit(a, i)
  page.failures = tonumber(a[i + 3])
  page.next_visit = tonumber(a[i + 4])
  if not page_callback(page) and a[i + 5] ~= '' then
    set_callback(page, a[i + 5])
    page.recipe = nil
    if a[i + 6] ~= '' then page.recipe = a[i + 6] end
  end
  store_page(a[i], pack_page(page), raw)
  reindex(a[i], page)
end
function OPS.redirect(a, i)
  local page, raw = visit(a, i)
  page.flags = bit.bor(page.flags or 0, tonumber(a[i + 4]))
  page.redirect_to = a[i + 3]
  store_page(a[i], pack_page(page), raw)
end
function OPS.flags(a, i)
  local raw = read_page(a[i])
  if raw then
    local page = unpack_page(raw)
    page.flags = bit.bor(page.flags or 0, tonumber(a[i + 1]))
    store_page(a[i], pack_page(page), raw)
  end
end
function OPS.listing(a, i)
  local raw = read_page(a[i])
  if raw then
    local page = unpack_page(raw)
    page.listing = a[i + 1]
    store_page(a[i], pack_page(page), raw)
  end
end
function OPS.postpone(a, i)
  local raw = read_page(a[i])
  if raw then
    local page = unpack_page(raw)
    if (page.next_visit or 0) == tonumber(a[i + 1]) then
      page.next_visit = tonumber(a[i + 2])
      store_page(a[i], pack_page(page), raw)
      reindex(a[i], page)
    end
  end
end
function OPS.links(a, i)
  register()
  wrote = true
  redis.call('HSET', LINKS, a[i], a[i + 1])
end
function OPS.unlink(a, i)
  if redis.call('HDEL', LINKS, a[i]) == 1 then wrote = true end
end

local applied, failed = 0, nil
local i = FIRST
while i <= #ARGV do
  local name = ARGV[i]
  local okw, err = pcall(OPS[name], ARGV, i + 1)
  if not okw then
    if type(err) == 'table' then err = err.err end
    failed = tostring(err)
    break
  end
  applied = applied + 1
  i = i + 1 + ARITY[name]
end
if wrote then redis.call('INCR', GENERATION) end
-- (cjson writes an empty table as {}: the effects are objects.)
local checks = {}
for member, at in pairs(CHECKS) do checks[#checks + 1] = {member, at or ''} end
local effects = cjson.encode({
  sums = SUMS, checks = checks, due = DUE, splits = splits, new_host = new_host,
  latest = latest or '', n = n, p = tonumber(redis.call('HGET', DIR, 'p')) or 0})
-- The ledger: this script's effects kept, older ones of other flushes
-- taken. Those past LEDGER_HONOURED (an hour less than P:fxdone keeps the
-- tokens applied) are taken as expired: their phase 3 may be forgotten
-- (P:fxdone trimmed), so the caller applies only what may be applied twice
-- (the host listed, the revisit bounds lowered) and marks the shard's
-- sums as not to be trusted, unless P:fxdone or P:fxheld lists the token (then
-- it was applied: 'done', nothing marked); the entry goes once that is done.
local now = tonumber(redis.call('TIME')[1])
local taken = {}
local flat = redis.call('HGETALL', LEDGER)
for k = 1, #flat, 2 do
  local ok_entry, entry = pcall(cjson.decode, flat[k + 1])
  if not ok_entry or type(entry) ~= 'table' or not tonumber(entry[1]) then
    redis.call('HDEL', LEDGER, flat[k])
  elseif now - tonumber(entry[1]) > LEDGER_HONOURED then
    taken[#taken + 1] = {flat[k], entry[2], true}
  elseif now - tonumber(entry[1]) >= ADOPT_AFTER then
    taken[#taken + 1] = {flat[k], entry[2], false}
  end
end
-- Kept whenever there are effects, a write applied or not: the splits are
-- made before the writes, so a script whose first write fails (a damaged
-- record) has still moved pages to a new bucket, whose bound must reach
-- the revisit index (else its pages are never due).
if applied > 0 or splits > 0 or new_host or next(SUMS) or next(CHECKS) or next(DUE) then
  redis.call('HSET', LEDGER, string.match(TOKEN, '[^:]*$'), cjson.encode({now, effects}))
end
local taken_json = '[]'
if #taken > 0 then taken_json = cjson.encode(taken) end
return finish(applied, failed, effects, taken_json)

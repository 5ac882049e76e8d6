
-- Phase 2 of a flush on a Redis Cluster (cluster layout): the page and links
-- writes of the hosts of one host group, in staging order (a reply lost,
-- the same writes with more after them are sent again under the same
-- token: the count applied is of a prefix of them); every key it touches
-- is in KEYS and carries the group's
-- tag {<scope>|<group>}. What such a write changes in keys of the scope's
-- shard (the scope's hosts, the revisit index, the sums by next visit, the
-- checks since the mark, the splits count) is not written here but
-- returned as effects, for the shard's script of phase 3, the group's
-- hosts' together; they are kept under the token with the count of writes
-- applied, so that a script sent again after its reply was lost returns
-- the same effects and applies nothing twice.
--
-- The effects are also kept in the group's ledger (P:fx:{<scope>|<group>},
-- token -> [time, effects]) until the shard's script has applied them (the
-- caller deletes them then): a worker that dies before its phase 3 leaves
-- them there, and the next flush that writes the group takes those older
-- than the age given (the shard's script applies each token's effects
-- once, whoever sends them). One token, one ledger entry a call, whatever
-- the number of its hosts.
--
-- KEYS: the token, the group's ledger, then each host's record (hd), links
-- hash (ln), write generation (wg: raised once if a page state or links
-- record of the host was written or deleted) and per bucket declared its
-- two hashes (pg, pgl). ARGV: the server's hash-max-listpack-value, the
-- age (seconds) past which another flush's effects in the ledger are
-- taken, the deadline of the flush's write-ahead intent (0: none; past it
-- on this node's clock the script writes nothing and says {'late'}: see
-- cluster.py, _phase_hosts), the number of hosts, then per host: its key
-- part, the bucket count the caller planned from, the splits it planned,
-- the index in KEYS of its record, the number of buckets declared and their
-- numbers; then the writes: each its host's number (from 1), its name and
-- ARITY[name] arguments, a page's field first.
-- Returns {applied, replayed (0/1), error ('' none), effects (JSON),
-- effects taken from the ledger (JSON: [token, effects, expired] triples,
-- expired true for an entry older than LEDGER_HONOURED: only its idempotent
-- parts are applied, see cluster.py, _Effects.expired)}, or {'late'} (see
-- DEADLINE), or {'n', part, count, ...} for each host whose bucket count
-- is not the one planned from, or {'blocked', part, splits, ...} for each
-- host of which only that many of the planned splits can be made (a
-- bucket's key beyond the count is taken): nothing written then. A host
-- whose record or keys are damaged ends the script at its first write,
-- with its error: the writes before it applied, nothing of it or after (the
-- caller sends the other hosts' writes after it again, without the damaged
-- host's, under a new token: see cluster.py, _phase_hosts).
local TOKEN, LEDGER = KEYS[1], KEYS[2]
local done = redis.call('GET', TOKEN)
if done then
  local kept = cjson.decode(done)
  return {kept[1], 1, kept[2], kept[3], '[]'}
end
local LISTPACK_VALUE, ADOPT_AFTER = tonumber(ARGV[1]), tonumber(ARGV[2])
local DEADLINE, HOSTS = tonumber(ARGV[3]), tonumber(ARGV[4])
-- A reader may drop the intent once it is past its deadline (by more than
-- the nodes' clocks differ): a ledger entry written after that would be
-- listed by no intent. The caller writes its intent again and resends.
-- This node's time (read once), the group's ledger (read once: see below).
local NOW, LEDGER_FLAT = nil, nil
if DEADLINE > 0 then
  NOW = tonumber(redis.call('TIME')[1])
  if NOW > DEADLINE then return {'late'} end
end
local HOST, FIRST = {}, nil
do
  local at = 5
  for h = 1, HOSTS do
    local part, planned, splits = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    local base, declared = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
    local buckets = {}
    for k = 0, declared - 1 do
      buckets[tonumber(ARGV[at + 5 + k])] = {KEYS[base + 3 + 2 * k], KEYS[base + 4 + 2 * k]}
    end
    HOST[h] = {part = part, planned = planned, splits = splits, dir = KEYS[base],
               links = KEYS[base + 1], generation = KEYS[base + 2], buckets = buckets,
               old = {}, absent = {}}
    at = at + 5 + declared
  end
  FIRST = at
end
local ARITY = {page = 3, check = 8, failure = 7, redirect = 5, links = 2, unlink = 1,
               flags = 2, listing = 2, postpone = 3}
-- The host being written (set by each host's turn below).
local DIR, LINKS, GENERATION, BUCKETS, PART
local function bucket_keys(b)
  local names = BUCKETS[b]
  if not names then error('bucket ' .. b .. ' of ' .. DIR .. ' was not declared', 0) end
  return names[1], names[2]
end
-- A page's bucket in a host of *at* buckets, its field hashed once for as
-- long as the count holds (a write's bucket is wanted when its keys are
-- checked, read, written and indexed).
local function host_bucket(host, at, field)
  if host.memo_at ~= at then host.memo_at, host.memo = at, {} end
  local b = host.memo[field]
  if not b then
    b = bucket_of(at, field)
    host.memo[field] = b
  end
  return b
end

-- What the scope's shard is to get (phase 3), the group's hosts' together:
-- sums deltas by "<visit>|<callback>" -> {pages, bytes}; the last check of
-- each page written ("<host part>|<field>" -> time, false: no callback); the
-- least next visit of each bucket written ("<host part>|<n>"); splits made;
-- the hosts to be in their scope's hosts (whenever a host's record or
-- links are written, not only when its record is new: a host whose first
-- flush died before its phase 3, its ledger entry dropped, is listed again
-- by its next write); the latest last check written; each host's bucket
-- and page counts after the writes.
local SUMS, CHECKS, DUE, LISTED, COUNTS = {}, {}, {}, {}, {}
local splits, latest = 0, false

local function finish(applied, failed, taken)
  local checks, hosts = {}, {}
  for member, at in pairs(CHECKS) do checks[#checks + 1] = {member, at or ''} end
  for part in pairs(LISTED) do hosts[#hosts + 1] = part end
  -- (cjson writes an empty table as {}: the effects are objects.)
  local effects = cjson.encode({
    sums = SUMS, checks = checks, due = DUE, splits = splits, hosts = hosts,
    latest = latest or '', counts = COUNTS})
  -- The effects as a JSON string, escaped once for both the ledger entry
  -- and the token ([time, effects] and [applied, error, effects], as
  -- cjson.encode writes those lists: the effects are the bulk of both).
  local quoted = cjson.encode(effects)
  -- The ledger: this script's effects kept, older ones of other flushes
  -- taken. Those past LEDGER_HONOURED (an hour less than P:fxdone keeps the
  -- tokens applied) are taken as expired: their phase 3 may be forgotten
  -- (P:fxdone trimmed), so the caller applies only what may be applied
  -- twice (the hosts listed, the revisit bounds lowered) and marks the
  -- shard's sums as not to be trusted, unless P:fxdone or P:fxheld lists
  -- the token (then it was applied: 'done', nothing marked); the entry
  -- goes once that is done.
  local taken_json = '[]'
  if taken then
    local now = NOW or tonumber(redis.call('TIME')[1])
    local found = {}
    local flat = LEDGER_FLAT
    for k = 1, #flat, 2 do
      local ok_entry, entry = pcall(cjson.decode, flat[k + 1])
      if not ok_entry or type(entry) ~= 'table' or not tonumber(entry[1]) then
        redis.call('HDEL', LEDGER, flat[k])
      elseif now - tonumber(entry[1]) > LEDGER_HONOURED then
        found[#found + 1] = {flat[k], entry[2], true}
      elseif now - tonumber(entry[1]) >= ADOPT_AFTER then
        found[#found + 1] = {flat[k], entry[2], false}
      end
    end
    -- Kept whenever there are effects, a write applied or not: the splits
    -- are made before the writes, so a script whose first write fails (a
    -- damaged record) has still moved pages to a new bucket, whose bound
    -- must reach the revisit index (else its pages are never due).
    if applied > 0 or splits > 0 or next(LISTED) or next(SUMS) or next(CHECKS)
        or next(DUE) then
      redis.call('HSET', LEDGER, string.match(TOKEN, '[^:]*$'),
        '[' .. tostring(now) .. ',' .. quoted .. ']')
    end
    if #found > 0 then taken_json = cjson.encode(found) end
  end
  redis.call('SET', TOKEN, '[' .. tostring(applied) .. ',' .. cjson.encode(failed or '') .. ','
    .. quoted .. ']', 'EX', TOKEN_TTL)
  return {applied, 0, failed or '', effects, taken_json}
end

-- The ledger first: every host's effects go there. Read whole now (its
-- type said by the read's error), taken from in finish: nothing before
-- finish writes it.
LEDGER_FLAT = redis.pcall('HGETALL', LEDGER)
if LEDGER_FLAT.err then
  local kind = redis.call('TYPE', LEDGER).ok
  return finish(0, 'WRONGTYPE ' .. LEDGER .. ' is a ' .. kind .. ', not a hash: nothing of '
    .. 'the group was applied', false)
end

local function check_type(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= want then
    return 'WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. want
      .. ': nothing of the host was applied'
  end
end
-- The write generation is raised after the writes: INCR must not fail then.
local function check_counter(key)
  -- One GET: absent (false), a string, or an error for another type.
  local v = redis.pcall('GET', key)
  local kind = 'string'
  if type(v) == 'table' then
    kind = redis.call('TYPE', key).ok
  elseif not v then
    return
  elseif v == '0' or (string.match(v, '^%-?[1-9]%d*$') and #v <= 18) then
    -- What INCR takes, and can raise without overflowing.
    return
  end
  return key .. ' is not a counter (a ' .. kind .. '): nothing of the host was applied'
end
local function enter(host)
  DIR, LINKS, GENERATION, BUCKETS, PART = host.dir, host.links, host.generation,
    host.buckets, host.part
end

-- Every host's bucket count and planned splits checked before anything is
-- written; a host whose record is damaged has its error noted (the writes
-- before its first are applied, then its error said).
do
  local mismatched, blocked = {}, {}
  for h = 1, HOSTS do
    local host = HOST[h]
    enter(host)
    -- Its bucket and page counts read at once (the page count then
    -- follows its HINCRBYs: see store_page); a record of another type
    -- fails the read.
    local counts = redis.pcall('HMGET', DIR, 'n', 'p')
    local n, stop_error
    if counts.err then
      stop_error = 'WRONGTYPE ' .. DIR .. ' is a ' .. redis.call('TYPE', DIR).ok
        .. ', not a hash: nothing of the host was applied'
    else
      local stored = counts[1]
      n = stored and tonumber(stored)
      if not stored then
        n = 1
      elseif not n or n < 1 or n ~= math.floor(n) then
        -- (As bucket_count says it.)
        stop_error = 'the bucket count in ' .. DIR .. ' is not a number: ' .. stored
      end
      -- Its 'n' stored: register's HSETNX would do nothing.
      host.has_n = stored and true
      host.pages = tonumber(counts[2]) or 0
      -- Its new pages counted here and added by one HINCRBY after the
      -- writes when that cannot fail (its page count absent or an integer
      -- far from overflowing); else one a page, as a failure of its own.
      local p = counts[2]
      host.added = 0
      host.batched = not p or p == '0' or (string.match(p, '^%-?[1-9]%d*$') and #p <= 18)
    end
    if stop_error then
      host.failed = stop_error
      stop_error = nil
    else
      host.n = n
    end
    if host.failed then
      -- (Its writes are not made: see below.)
    elseif n ~= host.planned then
      mismatched[#mismatched + 1] = PART
      mismatched[#mismatched + 1] = n
    else
      for s = 0, host.splits - 1 do
        local at = n + s
        local level = bucket_level(at)
        local from_small, from_large = bucket_keys(at - level)
        local to_small, to_large = bucket_keys(at)
        local stuck = false
        for _, key in ipairs({from_small, from_large}) do
          local kind = redis.call('TYPE', key).ok
          if kind ~= 'none' and kind ~= 'hash' then stuck = true end
        end
        if stuck or redis.call('EXISTS', to_small) == 1 or redis.call('EXISTS', to_large) == 1 then
          blocked[#blocked + 1] = PART
          blocked[#blocked + 1] = s
          break
        end
      end
    end
  end
  if #mismatched > 0 then return {'n', unpack(mismatched)} end
  if #blocked > 0 then return {'blocked', unpack(blocked)} end
end

-- The host's state as its writes go (set by each host's turn), and the
-- host being written.
local n, wrote, listed = 0, false, false
local current = nil
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
local function register()
  if not listed then
    if not current.has_n then
      redis.call('HSETNX', DIR, 'n', n)
      current.has_n = true
    end
    -- (SADD in phase 3: listed again costs nothing.)
    LISTED[PART] = true
    listed = true
  end
end
local function read_page(field)
  -- Read already when its keys were checked (first_refused), if this is
  -- the host's first write of the page; else read now.
  local old = current.old[field]
  if old ~= nil then
    current.old[field] = nil
    return old
  end
  local small, large = bucket_keys(host_bucket(current, n, field))
  return redis.call('HGET', small, field) or redis.call('HGET', large, field)
end
local function store_page(field, record, old)
  register()
  wrote = true
  if old == nil then old = read_page(field) or false end
  -- Where the record is known not to be (read_ahead; until its first store).
  local absent = current.absent[field]
  current.absent[field] = nil
  local small, large = bucket_keys(host_bucket(current, n, field))
  local into, other = small, large
  if #field > LISTPACK_VALUE or #record > LISTPACK_VALUE then into, other = large, small end
  local moved = 0
  if absent ~= 'both' and not (absent == 'small' and other == small) then
    moved = redis.call('HDEL', other, field)
  end
  if redis.call('HSET', into, field, record) == 1 and moved == 0 then
    if current.batched then
      current.added = current.added + 1
    else
      current.pages = redis.call('HINCRBY', DIR, 'p', 1)
    end
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
  if page_callback(page) then lower_due(host_bucket(current, n, field), page.next_visit or 0) end
end
local OPS = {}
function OPS.page(a, i)
  store_page(a[i], a[i + 1])
  if a[i + 2] ~= '' then lower_due(host_bucket(current, n, a[i]), a[i + 2]) end
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

-- A key's type, read once (before any write: nothing changes it meanwhile).
local TYPES = {}
local function checked_type(key, want)
  local kind = TYPES[key]
  if not kind then
    kind = redis.call('TYPE', key).ok
    TYPES[key] = kind
  end
  if kind ~= 'none' and kind ~= want then
    return 'WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a ' .. want
      .. ': nothing of the host was applied'
  end
end
-- The first write of a page of a host that makes no split: its record
-- read now (kept in host.old for read_page), the reads checking its keys'
-- types (an error: not a hash), the large ones' too when the record is
-- among the small ones; where it is not is noted in host.absent ('both',
-- or 'small' when it is among the large ones), so that its first store
-- deletes it from nowhere it is not. Returns the error, if any.
local function read_ahead(host, field, small, large)
  local raw = redis.pcall('HGET', small, field)
  if type(raw) == 'table' then return checked_type(small, 'hash') end
  if raw then
    local damaged = checked_type(large, 'hash')
    if not damaged then host.old[field] = raw end
    return damaged
  end
  raw = redis.pcall('HGET', large, field)
  if type(raw) == 'table' then return checked_type(large, 'hash') end
  host.old[field] = raw
  host.absent[field] = raw and 'small' or 'both'
end
-- Every key a host's writes touch is of its type (or absent): a damaged
-- key fails the host's writes whole. Returns the number (from 1) of the
-- first write not to be made (that of a damaged host, or unknown), and
-- the error it says; nil when every write may be made.
local function first_refused()
  for h = 1, HOSTS do
    local host = HOST[h]
    if not host.failed then
      host.failed = check_type(host.links, 'hash') or check_counter(host.generation)
    end
  end
  -- Every write's keys checked (up to one that cannot be read), then the
  -- first write of a host found damaged is the first refused.
  local i, k, last, said = FIRST, 1, nil, nil
  while i <= #ARGV do
    local host, name = HOST[tonumber(ARGV[i])], ARGV[i + 1]
    if not host then
      last, said = k, 'write ' .. k .. ' names no host'
      break
    end
    if not ARITY[name] then
      last, said = k, 'unknown write ' .. tostring(name)
      break
    end
    if not host.failed and name ~= 'links' and name ~= 'unlink' then
      enter(host)
      local field = ARGV[i + 2]
      local okb, small, large = pcall(bucket_keys, host_bucket(host, host.n + host.splits, field))
      if not okb then
        host.failed = tostring(small)
      elseif host.splits > 0 then
        -- (Its pages move before the writes: read then.)
        host.failed = checked_type(small, 'hash') or checked_type(large, 'hash')
      elseif host.old[field] == nil then
        host.failed = read_ahead(host, field, small, large)
      end
    end
    i = i + 2 + ARITY[name]
    k = k + 1
  end
  i, k = FIRST, 1
  while i <= #ARGV and (not last or k < last) do
    local host = HOST[tonumber(ARGV[i])]
    if host.failed then return k, host.failed end
    i = i + 2 + ARITY[ARGV[i + 1]]
    k = k + 1
  end
  return last, said
end

-- Splits, as layout 4's flush makes them (linear hashing); the new bounds
-- of both buckets only lower the index (phase 3's ZADD LT): a lower bound
-- stays one, and a reader sets a stale one right.
local function split(host)
  for _ = 1, host.splits do
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
    for b, at in pairs(least) do lower_due(b, at) end
    n = n + 1
    splits = splits + 1
    redis.call('HSET', DIR, 'n', n)
    host.has_n = true
    -- (A host that splits has pages: listed in its scope, as a split of
    -- layout 4 lists it.)
    LISTED[PART] = true
  end
end

local refused_at, refused = first_refused()
-- Each host's splits first (none of a damaged host), then the writes in
-- order, each with its host's state.
local function switch(host)
  if current == host then return end
  if current then current.cur, current.wrote, current.listed = n, wrote, listed end
  enter(host)
  n, wrote, listed = host.cur, host.wrote, host.listed
  current = host
end
for h = 1, HOSTS do
  local host = HOST[h]
  if not host.failed then
    host.cur, host.wrote, host.listed = host.n, false, false
    switch(host)
    split(host)
  end
end
local applied, failed = 0, nil
local i = FIRST
while i <= #ARGV do
  if applied + 1 == refused_at then
    failed = refused
    break
  end
  local host, name = HOST[tonumber(ARGV[i])], ARGV[i + 1]
  switch(host)
  local okw, err = pcall(OPS[name], ARGV, i + 2)
  if not okw then
    if type(err) == 'table' then err = err.err end
    failed = tostring(err)
    break
  end
  applied = applied + 1
  i = i + 2 + ARITY[name]
end
if current then current.cur, current.wrote, current.listed = n, wrote, listed end
-- Whether a page state or links record of a host was written or deleted:
-- its write generation is raised once (one INCR a host a script, not a
-- page: StateStore.write_generation); its new pages counted (one HINCRBY).
for h = 1, HOSTS do
  local host = HOST[h]
  if host.cur then
    if host.wrote then redis.call('INCR', host.generation) end
    if host.added > 0 then host.pages = redis.call('HINCRBY', host.dir, 'p', host.added) end
    COUNTS[host.part] = {host.cur, host.pages}
  end
end
return finish(applied, failed, true)

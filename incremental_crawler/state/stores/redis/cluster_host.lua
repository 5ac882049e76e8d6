-- Phase 2 of a flush on a Redis Cluster (cluster layout 8): the page and
-- links writes of the hosts of one host group, in staging order (a reply
-- lost, the same writes with more after them are sent again under the
-- same token: the count applied is of a prefix of them), and what they
-- change of the scope in the group's own keys (the group is its hosts'
-- scope shard): the scope's hosts (P:hs), the revisit index lowered (ZADD
-- LT into P:dueb, each bound's summary mark in P:duer dropped), the splits
-- count, the sums by next visit (P:nvs, P:nvf:<k>), the latest check
-- (P:nvm) and the checks since the mark (ZADD GT into P:ck), all in this
-- one atomic script: no ledger, no write-ahead intent, no later phase.
-- Every key it touches carries the group's tag {<scope>|<group>} and is
-- in KEYS, the fine sums too: a fixed set of hashes
-- (P:nvf:{<scope>|<group>}:<k>, a visit's in its hour modulo their
-- number), since the hours an old record names are known only once it is
-- read. The
-- count applied and the script's answer are kept under the token, so
-- that a script sent again after its reply was lost applies nothing twice
-- and returns the same.
--
-- KEYS: the token, the group's dueb, splits, hs, nvs, nvm, ck, duer, its
-- fine sums' hashes (nvf, k = 0, 1, ...), then each host's record (hd), links hash (ln), write generation (wg: raised
-- once if a page state or links record of the host was written or
-- deleted) and per bucket declared its two hashes (pg, pgl). ARGV: the
-- server's hash-max-listpack-value, the number of the group's fine sums'
-- hashes, the number of hosts, then per host:
-- its key part, the bucket count the caller planned from, the splits it
-- planned, the index in KEYS of its record, the number of buckets declared
-- and their numbers; then the writes: each its host's number (from 1), its
-- name and ARITY[name] arguments, a page's field first.
-- Returns {applied, replayed (0/1), error ('' none), answer (JSON: each
-- host's bucket and page counts after the writes, 'counts', and 'lost'
-- when a stored sum could not be added to: see apply_effects)}, or
-- {'n', part, count, ...} for each host whose bucket count is not the
-- one planned from, or {'blocked', part, splits, ...} for each host of
-- which only that many of the planned splits can be made (a bucket's key
-- beyond the count is taken): nothing written then. A damaged key of the
-- group's own (its scope shard's) fails the script whole, before any
-- write. A host whose record or keys are damaged ends the script at its
-- first write, with its error: the writes before it applied with their
-- effects, nothing of it or after (the caller sends the other hosts'
-- writes after it again, without the damaged host's, under a new token:
-- see cluster.py, _phase_hosts).
local TOKEN = KEYS[1]
local DUEB, SPLITS, HOSTS_SET, COARSE = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local META, CHECKS_SET, MARKS = KEYS[6], KEYS[7], KEYS[8]
local done = redis.call('GET', TOKEN)
if done then
  local kept = cjson.decode(done)
  return {kept[1], 1, kept[2], kept[3]}
end
local LISTPACK_VALUE, FINE_KEYS, HOSTS = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local SUM_MINUTE = 60
-- The fine sums of a group are kept in FINE_KEYS hashes (KEYS[9] on), a
-- visit's in its hour's modulo FINE_KEYS, each field the visit (a second)
-- and the callback: keys fixed whatever hours the old records name, and a
-- minute's sums in one hash of a few dozen fields.
local FINE_SPAN = 3600
local function fine_key(visit)
  return KEYS[9 + math.floor(visit / FINE_SPAN) % FINE_KEYS]
end
local HOST, FIRST = {}, nil
do
  local at = 4
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

-- What the writes change of the scope's keys in the group's slot, the
-- group's hosts' together, applied after the writes (apply_effects): sums
-- deltas by "<visit>|<callback>" -> {pages, bytes}; the last check of each
-- page written ("<host part>|<field>" -> time, false: no callback); the
-- least next visit of each bucket written ("<host part>|<n>"); splits made;
-- the hosts to be in their scope's hosts (whenever a host's record or
-- links are written, not only when its record is new); the latest last
-- check written; each host's bucket and page counts after the writes.
local SUMS, CHECKS, DUE, LISTED, COUNTS = {}, {}, {}, {}, {}
local splits, latest = 0, false


-- The effects of the writes applied, in the group's own keys (their types
-- checked before any write: see below). The checks since the mark only
-- ever raise a page's score (ZADD GT) and a page that lost its callback is
-- not removed: a repair applies its effects in another run, and these
-- commute; a member scored higher than its page's last check, or whose
-- page has no callback now, is harmless (a summary reads every page P:ck
-- lists and keeps those checked since with a callback). A sum that
-- cannot be added to (its value, or its minute's key, damaged) marks the
-- group's sums lost (P:nvm 'lost': every summary of the scope then reads
-- every page, exact, until the scope is reset) and is said in the answer.
local function apply_effects()
  local lost = false
  for field, delta in pairs(SUMS) do
    local pages, bytes = delta[1], delta[2]
    if pages ~= 0 or bytes ~= 0 then
      local visit, callback = string.match(field, '^(-?%d+)|(.*)$')
      visit = tonumber(visit)
      local minute = math.floor(visit / SUM_MINUTE)
      if not add_sum(COARSE, minute .. '|' .. callback, pages, bytes) then lost = true end
      if not add_sum(fine_key(visit), field, pages, bytes) then lost = true end
    end
  end
  local mark = tonumber(redis.call('HGET', META, 'mark'))
  if mark then
    for member, at in pairs(CHECKS) do
      if at and at >= mark then redis.call('ZADD', CHECKS_SET, 'GT', at, member) end
    end
  end
  if latest then
    local was = tonumber(redis.call('HGET', META, 'latest'))
    if not was or latest > was then redis.call('HSET', META, 'latest', latest) end
  end
  for member, bound in pairs(DUE) do
    redis.call('ZADD', DUEB, 'LT', bound, member)
    redis.call('HDEL', MARKS, member)
  end
  if splits > 0 then redis.call('INCRBY', SPLITS, splits) end
  if lost then redis.call('HSET', META, 'lost', redis.call('TIME')[1]) end
  local hosts = {}
  for part in pairs(LISTED) do hosts[#hosts + 1] = part end
  if #hosts > 0 then redis.call('SADD', HOSTS_SET, unpack(hosts)) end
  return lost
end

local function finish(applied, failed, effects)
  local lost = effects and apply_effects()
  -- (cjson writes an empty table as {}: the answer is an object.)
  local answer = cjson.encode({counts = COUNTS, lost = lost or nil})
  redis.call('SET', TOKEN, '[' .. tostring(applied) .. ',' .. cjson.encode(failed or '') .. ','
    .. cjson.encode(answer) .. ']', 'EX', TOKEN_TTL)
  return {applied, 0, failed or '', answer}
end

-- The group's own keys (its scope shard's) are of their types, and its
-- splits count a number, before anything is written: a damaged one fails
-- the group's script whole (a script that erred halfway could not be sent
-- again under its token).
do
  local want = {{DUEB, 'zset'}, {SPLITS, 'string'}, {HOSTS_SET, 'set'}, {COARSE, 'hash'},
                {META, 'hash'}, {CHECKS_SET, 'zset'}, {MARKS, 'hash'}}
  for _, pair in ipairs(want) do
    local kind = redis.call('TYPE', pair[1]).ok
    if kind ~= 'none' and kind ~= pair[2] then
      return finish(0, 'WRONGTYPE ' .. pair[1] .. ' is a ' .. kind .. ', not a ' .. pair[2]
        .. ': nothing of the group was applied', false)
    end
  end
  local count = redis.call('GET', SPLITS)
  if count and not tonumber(count) then
    return finish(0, SPLITS .. ' is not a number: nothing of the group was applied', false)
  end
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
    -- (SADD after the writes: listed again costs nothing.)
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
-- of both buckets only lower the index (ZADD LT, after the writes): a lower bound
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

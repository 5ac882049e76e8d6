
-- A repair's part in its host's slot on a Redis Cluster (cluster layout):
-- the pages deleted (every bucket of the host, or every variant of one
-- page in its bucket), their links records, the host's record or page
-- count, its write generation raised, and what the pages deleted take out
-- of the scope's sums, computed from the records as this script deletes
-- them and kept in the host group's ledger under the repair's token (its shard's
-- script applies them once: see admin.py, _forget_in_slots). One run: a
-- page a crawl wrote or changed after the repair planned is deleted and
-- taken out of the sums as it is then, never counted on after its deletion.
--
-- KEYS: the host's record (hd), links (ln), write generation (wg), ledger
-- (fx), the run's token key (its answer, kept TOKEN_TTL: sent again after
-- a lost reply, by the client's retry or the caller's, the script returns
-- it and deletes nothing more), then the two hashes (pg, pgl) of each
-- bucket declared. ARGV: the
-- bucket count planned from, the token, the deadline of the repair's
-- write-ahead intent (0: none; past it on this node's clock the script
-- deletes nothing and says {'late'}), then 'host' (every declared bucket:
-- all of the host's) or 'page' and the page's URL part (its variants too,
-- in the one bucket declared).
-- Returns {'n', count} when the host's bucket count is not the one planned
-- (nothing deleted: the caller plans again), {'late'} (see DEADLINE), else
-- {pages deleted, links records deleted, effects (JSON; '' none)}.
local DIR, LINKS, GENERATION, LEDGER, RAN = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local PLANNED_N, TOKEN, DEADLINE = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local MODE, URL_PART = ARGV[4], ARGV[5]
local ran = redis.call('GET', RAN)
if ran then return cjson.decode(ran) end
-- A reader may drop the intent once it is past its deadline (by more than
-- the nodes' clocks differ): an entry written in the ledger after that
-- would be listed by no intent, and lost if the repair stopped before its
-- shard's script. The caller writes its intent again and resends (as a
-- flush's host script, cluster_host.lua).
if DEADLINE > 0 and tonumber(redis.call('TIME')[1]) > DEADLINE then return {'late'} end
local n = bucket_count(DIR)
if n ~= PLANNED_N then return {'n', n} end

-- Every key written is of its type (or absent), and everything deleted is
-- read (and decoded) first: a damaged key or record fails the repair
-- before anything is deleted (a script that erred halfway would leave it
-- half done).
for _, pair in ipairs({{LINKS, 'hash'}, {LEDGER, 'hash'}, {DIR, 'hash'}}) do
  local kind = redis.call('TYPE', pair[1]).ok
  if kind ~= 'none' and kind ~= pair[2] then
    error('WRONGTYPE ' .. pair[1] .. ' is a ' .. kind .. ', not a ' .. pair[2]
      .. ': nothing was deleted', 0)
  end
end
do
  -- What INCR takes, and can raise without overflowing.
  local kind = redis.call('TYPE', GENERATION).ok
  local v = kind == 'string' and redis.call('GET', GENERATION)
  if kind ~= 'none' and not (v and (v == '0'
      or (string.match(v, '^%-?[1-9]%d*$') and #v <= 18))) then
    error(GENERATION .. ' is not a counter (a ' .. kind .. '): nothing was deleted', 0)
  end
end
local doomed = {}
local fields = {}
local SUMS = {}
local function forget(raw)
  local callback, _, visit, bytes = page_summary(raw)
  if callback then
    local field = string.format('%d', visit) .. '|' .. callback
    local was = SUMS[field] or {0, 0}
    SUMS[field] = {was[1] - 1, was[2] - bytes}
  end
end
for k = 6, #KEYS do
  local flat = redis.call('HGETALL', KEYS[k])
  for j = 1, #flat, 2 do
    local field = flat[j]
    if MODE == 'host' or field == URL_PART
        or string.sub(field, 1, #URL_PART + 1) == URL_PART .. '\0' then
      forget(flat[j + 1])
      doomed[#doomed + 1] = {KEYS[k], field}
      fields[field] = true
    end
  end
end

local pages, links = 0, 0
if MODE == 'host' then
  for k = 6, #KEYS do
    pages = pages + redis.call('HLEN', KEYS[k])
    redis.call('DEL', KEYS[k])
  end
  links = redis.call('HLEN', LINKS)
  redis.call('DEL', LINKS, DIR)
  redis.call('INCR', GENERATION)
else
  for _, where in ipairs(doomed) do pages = pages + redis.call('HDEL', where[1], where[2]) end
  if pages > 0 then redis.call('HINCRBY', DIR, 'p', -pages) end
  for field in pairs(fields) do links = links + redis.call('HDEL', LINKS, field) end
  if pages > 0 or links > 0 then redis.call('INCR', GENERATION) end
end

local function ran_as(answer)
  redis.call('SET', RAN, cjson.encode(answer), 'EX', TOKEN_TTL)
  return answer
end
if not next(SUMS) then return ran_as({pages, links, ''}) end
-- (cjson writes an empty table as {}: the effects are objects.)
local effects = cjson.encode({sums = SUMS, checks = {}, due = {}, splits = 0,
                              new_host = false, latest = ''})
-- Stamped by this node's clock, as a host script's entry is (an adoption
-- tells its age on the clock of the ledger's node).
redis.call('HSET', LEDGER, TOKEN, cjson.encode({tonumber(redis.call('TIME')[1]), effects}))
return ran_as({pages, links, effects})

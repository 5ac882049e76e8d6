-- Count pages for the run, each once: the first worker to count a page does.
-- KEYS[1]: the run's counted pages; KEYS[2]: the workers hash; KEYS[3]: the
-- run's workers that left it (their crawls recorded, their counts kept);
-- KEYS[4]: the pages requested that the re-seeder's sum may count too
-- (requested before it summed: their visits may not be stored yet).
-- A page's field (12 bytes of a hash of its key: no "#..." field is 12
-- bytes long): "<column><summed>:<size>|<tag>|<reply>": its column (r requested, d
-- not due, s skipped, b in the re-seeder's sum of the pages not due, f
-- among the due pages it deferred), which of the re-seeder's sums counts it
-- -- too (1 the pages not due, f the due pages, 0 neither), its stored size,
-- the tag of the worker that counted it (for b: the re-seeder) and what that
-- worker was told when it wrote it; for a page counted not requested then
-- requested elsewhere, "|<tag>|<reply>" of the worker that counted it first
-- (its call run again after its reply was lost gets that reply).
-- Other fields: #w|<tag>: the worker of a tag (a short one keeps a page's
-- field small); #tags: the tags of the workers that counted pages or
-- answers (";" after each); #pages|<worker>, #size|<worker>: the pages a worker counted
-- not requested that the sum counts; #bulk, #deferred: the re-seeder's tag,
-- once it summed the pages not due, once it deferred due pages over its
-- limit; #took|<worker>: the sum left that worker's pages out (see
-- bulk_counted.lua); #sum: "<pages>|<size>|<first due>", the sum the
-- re-seeder counted (recorded once it did: the sum stands whatever becomes
-- of the re-seeder, whose stats may die with it, and leave.lua has the
-- worker that ends the run count it then); #left|<worker>, #lsize|<worker>:
-- the pages of the sum that worker counted leaving it, and their sizes
-- (a re-seeder killed before it recorded its sum: the worker that ends the
-- run makes up for those); #dsum, #dleft|<worker>: the same for the due
-- pages it deferred over its limit (their number, recorded once counted;
-- the pages a worker counted leaving that column).
-- KEYS[5]: the run key. ARGV[1]: this worker, ARGV[2]: its tag, ARGV[3]: its run's id
-- (a run no longer current: an error FENCED, nothing written; see fence.lua); then per page, in order: page, column (r, d, s),
-- size, sum (1, f, 0), its key (for a page requested in the sum; else ""). Returns what the run had for each: "" nothing (the
-- caller counts it), else "<column><summed>:<size>" as it was.
-- A page counted by a worker neither alive nor gone with its crawl recorded
-- (killed: its counts are lost) is counted again by the caller, but for one
-- it counted requested that the caller counts not requested (it stays
-- requested, for the worker that ends the run to count). A page the
-- caller counted itself gets the reply it got then: a call run again after
-- its reply was lost answers as the first did.
local refused = fenced(KEYS[5], ARGV[3], KEYS[2], ARGV[1])
if refused then return refused end
local me = ARGV[2]
-- The tags of the run's counters, for the worker that ends the run
-- (leave.lua). Looked up, not taken from HSETNX: the re-seeder's marks
-- (#bulk, #deferred) write its #w|<tag> before it counts any page.
redis.call('HSETNX', KEYS[1], '#w|' .. me, ARGV[1])
local tags = redis.call('HGET', KEYS[1], '#tags') or ''
if not string.find(';' .. tags, ';' .. me .. ';', 1, true) then
  redis.call('HSET', KEYS[1], '#tags', tags .. me .. ';')
end
local workers, known = {}, {}
local function worker(tag)
  local w = workers[tag]
  if w == nil then
    w = redis.call('HGET', KEYS[1], '#w|' .. tag) or ''
    workers[tag] = w
  end
  return w
end
local function kept(tag)
  local k = known[tag]
  if k == nil then
    local w = worker(tag)
    k = redis.call('HEXISTS', KEYS[2], w) == 1 or redis.call('SISMEMBER', KEYS[3], w) == 1
    known[tag] = k
  end
  return k
end
-- The re-seeder's sum stands once recorded (#sum), killed or not; one
-- killed before it recorded it is lost.
local bulk = redis.call('HGET', KEYS[1], '#bulk')
if bulk and not kept(bulk) and redis.call('HEXISTS', KEYS[1], '#sum') == 0 then bulk = nil end
local deferred = redis.call('HGET', KEYS[1], '#deferred')
if deferred and not kept(deferred) and redis.call('HEXISTS', KEYS[1], '#dsum') == 0 then
  deferred = nil
end

local function in_sum(counted, tag, delta)
  if string.sub(counted, 1, 1) ~= 'r' and string.sub(counted, 1, 1) ~= 'b'
     and string.sub(counted, 2, 2) == '1' then
    local size = tonumber(string.sub(counted, string.find(counted, ':', 1, true) + 1))
    redis.call('HINCRBY', KEYS[1], '#pages|' .. worker(tag), delta)
    redis.call('HINCRBY', KEYS[1], '#size|' .. worker(tag), delta * size)
  end
end

-- A page requested before a sum whose stored state the sum counts: the
-- re-seeder reads whether its visit is stored by then.
local function requested_in_sum(column, summed)
  return column == 'r' and ((summed == '1' and not bulk) or (summed == 'f' and not deferred))
end

-- This worker counts a page of the sum leaving it (requested after all).
local function left_sum(size)
  redis.call('HINCRBY', KEYS[1], '#left|' .. ARGV[1], 1)
  redis.call('HINCRBY', KEYS[1], '#lsize|' .. ARGV[1], tonumber(size))
end

local had = {}
for i = 4, #ARGV, 5 do
  local page, column, size, summed = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if requested_in_sum(column, summed) then redis.call('SADD', KEYS[4], ARGV[i + 4]) end
  local requested = column == 'r'
  local field = redis.call('HGET', KEYS[1], page)
  local old, owner, reply, before, before_reply
  if field then
    local parts = {}
    for part in string.gmatch(field .. '|', '([^|]*)|') do parts[#parts + 1] = part end
    old, owner, reply, before, before_reply = parts[1], parts[2], parts[3], parts[4], parts[5]
  end
  local answer
  if old and owner == me and (not requested or string.sub(old, 1, 1) == 'r') then
    answer = reply
  elseif old and before == me and not requested then
    -- Its counter's call run again after another worker requested the page.
    answer = before_reply
  else
    local sum_has_it = summed == '1' and bulk
    -- Requested in the due pages before they were deferred: not in that sum.
    local before_deferred = old and string.sub(old, 1, 2) == 'rf'
    -- A page the sum counts (b) is kept while the sum stands.
    -- A page a killed worker counted requested stays requested when the
    -- caller counts it not requested: its request is the run's (in the
    -- queue, in flight or answered, its answers merged in the run), and a
    -- list read again (a sitemap its killed reader held goes back to the
    -- queue) finds it stored by then, lastmod unchanged or not due. The
    -- caller counts nothing; the worker that ends the run counts it
    -- requested (settle.py), and its answers once.
    local killed_requested = old and string.sub(old, 1, 1) == 'r' and not requested
    if old and not kept(owner) and not (string.sub(old, 1, 1) == 'b' and bulk)
       and not killed_requested then
      -- Its counter was killed: its count is lost. The sum counts the page
      -- unless it left that worker's pages out (it had counted them).
      in_sum(old, owner, -1)
      if sum_has_it and redis.call('HEXISTS', KEYS[1], '#took|' .. worker(owner)) == 1 then
        sum_has_it = false
      end
      old = nil
    end
    if not old then
      if requested and summed == 'f' and deferred and not before_deferred then
        -- Deferred by the re-seeder, requested after all: it leaves that column.
        answer = 'f0:' .. size
        redis.call('HSET', KEYS[1], page, 'r0:' .. size .. '|' .. me .. '|' .. answer)
        redis.call('HINCRBY', KEYS[1], '#dleft|' .. ARGV[1], 1)
      elseif sum_has_it then
        -- In the sum already: requested now, it leaves it (the caller counts that).
        answer = 'b0:' .. size
        redis.call('HSET', KEYS[1], page, (requested and ('r0:' .. size .. '|' .. me)
                                           or (answer .. '|' .. bulk)) .. '|' .. answer)
        if requested then left_sum(size) end
      else
        local counted = column .. summed .. ':' .. size
        redis.call('HSET', KEYS[1], page, counted .. '|' .. me .. '|')
        if not bulk then in_sum(counted, me, 1) end
        answer = ''
      end
    elseif requested and string.sub(old, 1, 1) ~= 'r' then
      -- Counted not requested, requested after all: visited, the store's sum
      -- leaves it out from now on.
      local stored = string.sub(old, string.find(old, ':', 1, true) + 1)
      redis.call('HSET', KEYS[1], page, 'r0:' .. stored .. '|' .. me .. '|' .. old .. '|'
                                        .. owner .. '|' .. reply)
      in_sum(old, owner, -1)
      if string.sub(old, 1, 1) == 'b' then left_sum(stored) end
      answer = old
    else
      answer = old
    end
  end
  had[#had + 1] = answer
end
return had


-- Cluster layout 7 -> 8 (a migration: see layout.py, _regroup_scopes):
-- what a host group's pages say of their scope, read from the pages of
-- some of its hosts and written in the group's own keys (its scope shard
-- since layout 8), recounted rather than moved: layout 7 kept them per
-- shard of eight groups, where no sum can be split by group without the
-- pages. What may be written again is written here (a migration cut is
-- resumed: the hosts listed, SADD; each bucket's least next visit, ZADD
-- LT; each page checked since the mark, ZADD GT); the sums are returned,
-- for the caller to write once for the whole group, in one transaction
-- with its mark of the group done.
--
-- KEYS: the group's dueb, ck and hs, then each host's buckets' two
-- hashes (pg, pgl). ARGV: the mark of the group's old shard ('' none:
-- no check is kept), the number of hosts, then per host its key part, the
-- number of its first bucket read here and how many (a large host's
-- buckets are read over several calls; their 2 x count keys follow the
-- ones before in KEYS).
-- Returns {sums (JSON: "<visit>|<callback>" -> {pages, bytes}), latest
-- last check ('' none), pages read}; or, at the first record that cannot
-- be read, {'', '', pages read, its bucket's key, its field, why}: the
-- caller stops the migration naming it (what this call wrote before is
-- written again, the same, when the migration is resumed).
local DUEB, CHECKS, HOSTS = KEYS[1], KEYS[2], KEYS[3]
local mark = tonumber(ARGV[1])
local sums, latest, read = {}, false, 0
local k = 4
local at = 3
for _ = 1, tonumber(ARGV[2]) do
  local part, first, n = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  at = at + 3
  redis.call('SADD', HOSTS, part)
  for b = first, first + n - 1 do
    local least = nil
    for _, key in ipairs({KEYS[k], KEYS[k + 1]}) do
      local flat = redis.call('HGETALL', key)
      for f = 1, #flat, 2 do
        read = read + 1
        local ok, callback, checked, visit, bytes = pcall(page_summary, flat[f + 1])
        if not ok then return {'', '', read, key, flat[f], tostring(callback)} end
        if callback then
          local field = string.format('%d', visit) .. '|' .. callback
          local was = sums[field] or {0, 0}
          sums[field] = {was[1] + 1, was[2] + bytes}
          if mark and checked >= mark then
            redis.call('ZADD', CHECKS, 'GT', checked, part .. '|' .. flat[f])
          end
          if not latest or checked > latest then latest = checked end
        end
        local okd, due = pcall(due_of, flat[f + 1])
        if okd and due and (not least or due < least) then least = due end
      end
    end
    if least then redis.call('ZADD', DUEB, 'LT', least, part .. '|' .. b) end
    k = k + 2
  end
end
return {cjson.encode(sums), latest or '', read}

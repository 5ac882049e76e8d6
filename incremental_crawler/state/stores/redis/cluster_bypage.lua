
-- The page index of one item group on a Redis Cluster (cluster layout): adds and
-- removes members P:bypage:{<s>#<g>} ("<page>\0<item key>", score 0, read
-- by lex range), each with the item version of the write that made it
-- (P:bypagev:{<s>#<g>}, member -> version, same slot). A removal comes from
-- phase 3, after the item's record (in another slot) named another page;
-- it is dropped when the member was written by a later version since (the
-- item moved back meanwhile by another worker): a late removal cannot take
-- out a member that is current. An addition always writes (a repair may
-- have deleted the item, whose versions then start again).
-- KEYS: the index, its versions. ARGV: triples of 'add' | 'remove', member,
-- version. Returns how many members it added or removed.
local INDEX, VERSIONS = KEYS[1], KEYS[2]
local changed = 0
for i = 1, #ARGV, 3 do
  local op, member, version = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if op == 'add' then
    changed = changed + redis.call('ZADD', INDEX, 0, member)
    redis.call('HSET', VERSIONS, member, version)
  else
    local was = tonumber(redis.call('HGET', VERSIONS, member))
    if not was or was < version then
      changed = changed + redis.call('ZREM', INDEX, member)
      redis.call('HDEL', VERSIONS, member)
    end
  end
end
return changed

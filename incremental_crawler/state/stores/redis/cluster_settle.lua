-- A crawl's delivery marks settled in one slot of a Redis Cluster (cluster
-- layout): an item group's {<s>#<g>} (or the scope's own {<s>}, where code
-- before the marks moved to the groups kept them). Sent for every slot of
-- the scope after the flush's phases, so after every mark the flush wrote.
--
-- KEYS: the crawl's P:undel key in the slot, the slot's P:undelc. ARGV:
-- the crawl, '1' (every version delivered: its marks deleted) or '0' (only
-- forget the crawl if nothing waits on it any more).
if ARGV[2] == '1' then redis.call('DEL', KEYS[1]) end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
return 1

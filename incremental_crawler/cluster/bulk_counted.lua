-- The re-seeder counts the run's pages not due by the store's sums: from now
-- on count_page.lua counts none of them one by one. KEYS[1]: the run's
-- counted pages (see count_page.lua). Returns the pages counted one by one
-- that the sum counts too, and their sizes.
redis.call('HSET', KEYS[1], '#bulk', '1')
local counted = redis.call('HMGET', KEYS[1], '#pages', '#size')
return {tonumber(counted[1] or '0'), tonumber(counted[2] or '0')}

-- Leave: what the worker still holds goes back to the queue; the last
-- worker out with the queue drained ends the run. KEYS: workers, queue,
-- run, this worker's in-flight and held hashes, then the run's keys
-- (RUN_KEYS in coordinator.py: seen, unrecorded, claims, tombstones,
-- listings, decided, counted, early, left, requested_in_sum; left: the
-- workers gone with their crawls recorded, count_page.lua keeps what they
-- counted). ARGV: worker, its run's id.
-- Returns {requeued, the run's unrecorded failures, whether the run ended};
-- unrecorded is -1 (unknown) if the run key names another run: this
-- worker's was abandoned while it was silent (join.lua), and the keys it
-- wrote since are deleted. (No run key: the run ended without this worker,
-- reaped while silent; left as it was.)
local back = 0
for _, mine in ipairs({KEYS[4], KEYS[5]}) do
  for _, v in ipairs(redis.call('HVALS', mine)) do
    local s = string.find(v, '|', 1, true)
    redis.call('ZADD', KEYS[2], string.sub(v, 1, s - 1), string.sub(v, s + 1))
    back = back + 1
  end
  redis.call('DEL', mine)
end
redis.call('HDEL', KEYS[1], ARGV[1])
local run = redis.call('GET', KEYS[3])
if run and string.sub(run, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then
  for i = 6, #KEYS do redis.call('UNLINK', KEYS[i]) end
  return {back, -1, 0}
end
redis.call('SADD', KEYS[14], ARGV[1])
local unrecorded = tonumber(redis.call('GET', KEYS[7]) or '0')
local ended = 0
if redis.call('HLEN', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) == 0 then
  -- UNLINK: counted holds a field a page (GBs for a large crawl), freed
  -- off the server's main thread.
  redis.call('UNLINK', KEYS[3], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12],
             KEYS[13], KEYS[14], KEYS[15])
  ended = 1
end
return {back, unrecorded, ended}

-- How many jobs other live workers claimed and have not done yet (a dead
-- owner's job is not waited for: the next worker to claim it takes it
-- over, claim.lua). KEYS: claims, workers; ARGV: this worker, the worker TTL.
local claims = redis.call('HGETALL', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local done, pending = {}, 0
for i = 1, #claims, 2 do done[claims[i]] = true end
for i = 1, #claims, 2 do
  local job, owner = claims[i], claims[i + 1]
  if string.sub(job, -5) ~= ':done' and not done[job .. ':done'] and owner ~= ARGV[1] then
    local beat = redis.call('HGET', KEYS[2], owner)
    if beat and now - tonumber(beat) <= tonumber(ARGV[2]) then pending = pending + 1 end
  end
end
return pending

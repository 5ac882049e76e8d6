
local claims = redis.call('HGETALL', KEYS[1])
local done, pending = {}, 0
for i = 1, #claims, 2 do done[claims[i]] = true end
for i = 1, #claims, 2 do
  local job, owner = claims[i], claims[i + 1]
  if string.sub(job, -5) ~= ':done' and not done[job .. ':done'] and owner ~= ARGV[1]
     and redis.call('HEXISTS', KEYS[2], owner) == 1 then
    pending = pending + 1
  end
end
return pending

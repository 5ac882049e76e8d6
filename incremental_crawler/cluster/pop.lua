
local r = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #r == 0 then return false end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 0)
local ticket = redis.sha1hex(r[1])
redis.call('HSET', KEYS[2], ticket, r[2] .. '|' .. r[1])
return {ticket, r[1]}

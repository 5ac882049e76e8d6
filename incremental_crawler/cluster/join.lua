
local run = redis.call('GET', KEYS[1])
if not run then run = ARGV[2]; redis.call('SET', KEYS[1], run) end
local started = ARGV[3] .. run .. ':started'
redis.call('SET', started, ARGV[4], 'NX')
local t = redis.call('TIME')
redis.call('HSET', KEYS[2], ARGV[1], tonumber(t[1]) + tonumber(t[2]) / 1e6)
return {run, redis.call('GET', started)}

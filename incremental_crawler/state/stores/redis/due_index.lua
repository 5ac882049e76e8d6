
local pairs_ = redis.call('ZRANGE', ARGV[1], ARGV[2], ARGV[3], 'BYSCORE', 'LIMIT', ARGV[4],
                          ARGV[5], 'WITHSCORES')
return {table.concat(pairs_, '\255'), redis.call('GET', ARGV[6]) or ''}

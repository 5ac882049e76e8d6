
-- The last step of a summary on a Redis Cluster (cluster layout): each bucket's
-- bound in the revisit index set to the least next visit the summary read
-- of its pages, only if the mark the summary set before reading it is still
-- there (a write of the bucket since, by its host group's script, dropped
-- it: its page may be due before what was read). KEYS: the index (dueb),
-- the marks (duer), of the host group's slot. ARGV: per bucket its member and least next visit
-- ('': no page with a callback left: out of the index). Returns how many
-- bounds were set.
local set = 0
for j = 1, #ARGV, 2 do
  local member = ARGV[j]
  if redis.call('HDEL', KEYS[2], member) == 1 then
    if ARGV[j + 1] == '' then
      redis.call('ZREM', KEYS[1], member)
    else
      redis.call('ZADD', KEYS[1], 'XX', ARGV[j + 1], member)
    end
    set = set + 1
  end
end
return set

-- A plain write to one of the run's keys (a list's membership, the pages a
-- list decided, a page visited in the run's first second, a failure that
-- could not be recorded, the re-seeder's marks), made only by a live worker
-- of the current run: a worker fenced off it (its run no longer the current
-- one, abandoned while it was silent; or itself reaped, or silent past the
-- TTL by Redis time: see fence.lua) gets an error FENCED and writes nothing,
-- so that it never re-creates the key of a run abandoned and deleted.
-- KEYS: the run key's to write, the workers hash, the run key. ARGV: the
-- worker, the worker TTL, its run's id, the command ("SADD", "INCR",
-- "HSET"), then the command's arguments after the key.
local refused = fenced(KEYS[3], ARGV[3], KEYS[2], ARGV[1], ARGV[2])
if refused then return refused end
local command = ARGV[4]
if command ~= 'SADD' and command ~= 'INCR' and command ~= 'HSET' then
  return redis.error_reply('run_note.lua: unknown command ' .. command)
end
return redis.call(command, KEYS[1], unpack(ARGV, 5))

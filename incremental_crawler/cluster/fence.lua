-- The fence of the run scripts, put before each one's own body (see
-- coordinator.py): a worker fenced off the run (its run no longer the
-- current one, abandoned while it was silent: join.lua; or itself taken for
-- dead) gets an error FENCED from the script, which writes nothing: its
-- counts would be taken for a killed worker's, its writes would re-create
-- the keys of a run abandoned and deleted (beat.lua fences a worker the same
-- way, and reaps it). The keys are the calling script's (in its KEYS, one
-- slot): run_key, the run key ("<id>|<start>"); workers_key, the workers
-- hash (worker -> its last beat, Redis time).
-- fenced(run_key, run_id, workers_key, worker, ttl): nil when run_id is the
-- current run and (workers_key given) the worker is alive in it: in the
-- workers hash (not reaped) or, with ttl, its last beat within ttl seconds
-- of Redis time; else the error reply to return.
local function fenced(run_key, run_id, workers_key, worker, ttl)
  local run = redis.call('GET', run_key)
  if not run or string.sub(run, 1, #run_id + 1) ~= run_id .. '|' then
    return redis.error_reply('FENCED run ' .. run_id .. ' is not the current run')
  end
  if not workers_key then return nil end
  local dead
  if ttl == nil then
    -- Reaped while silent (its run still current).
    dead = redis.call('HEXISTS', workers_key, worker) == 0
  else
    local last = redis.call('HGET', workers_key, worker)
    local t = redis.call('TIME')
    dead = not last or tonumber(t[1]) + tonumber(t[2]) / 1e6 - tonumber(last) > tonumber(ttl)
  end
  if dead then
    return redis.error_reply('FENCED worker ' .. worker .. ' was taken for dead')
  end
  return nil
end

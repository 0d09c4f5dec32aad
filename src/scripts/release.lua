-- release: undo one level of re-entry; the last level frees the lock and hands
-- the baton to one waiter.
--
-- KEYS[1]  lock key   (hash: flag, count, fence)
-- KEYS[2]  baton key  (list holding at most one "ok" token)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds, refreshed when an inner level is released
-- ARGV[3]  baton TTL in milliseconds
--
-- Returns -1     the caller does not own the lock (its lease ran out, or it was
--                force-unlocked); nothing was changed
--         depth  > 0: an inner level was released, the lock is still held
--         0      the lock was freed and the baton pushed
local owner = redis.call('HGET', KEYS[1], 'flag')
if owner ~= ARGV[1] then
  return -1
end

local depth = tonumber(redis.call('HGET', KEYS[1], 'count'))
if depth > 1 then
  redis.call('HSET', KEYS[1], 'count', depth - 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return depth - 1
end

-- Check the baton key before the first write: a script error is not rolled
-- back, and a lock deleted without its baton would leave waiters parked until
-- their maximum park time.
local baton_type = redis.call('TYPE', KEYS[2])['ok']
if baton_type ~= 'list' and baton_type ~= 'none' then
  return redis.error_reply('WRONGTYPE baton key ' .. KEYS[2] .. ' holds a ' .. baton_type .. ', not a list')
end

redis.call('DEL', KEYS[1])
redis.call('RPUSH', KEYS[2], 'ok')
-- One token wakes one waiter; a second token would only cost a wasted retry.
redis.call('LTRIM', KEYS[2], 0, 0)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 0

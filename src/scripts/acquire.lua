-- acquire: take a free lock, re-enter a lock this identity holds, or report
-- how long the current holder's lease still runs.
--
-- KEYS[1]  lock key   (hash: flag = owner identity, count = depth, fence = token)
-- KEYS[2]  fence key  (string: per-lock fencing counter, never expires)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds (PEXPIRE of the lock key)
--
-- Returns {1, fence, depth}  acquired: fresh (depth 1) or re-entered (depth > 1)
--         {0, pttl}          held by another identity; pttl is the lock key's
--                            remaining lease in ms (-1 when it has none)
--
-- Errors before any write: HGET fails with WRONGTYPE when the lock key is not a
-- hash, and INCR fails when the fence key is not an integer, so a bad key is
-- reported without leaving a half-made lock behind.
local owner = redis.call('HGET', KEYS[1], 'flag')

if owner == false then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

if owner == ARGV[1] then
  local depth = redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- Re-entry keeps the fence of this ownership: the token changes only when
  -- ownership changes hands.
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')), depth}
end

return {0, redis.call('PTTL', KEYS[1])}

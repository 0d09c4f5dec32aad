-- acquire: take a free lock, re-enter a lock this thread holds, or report
-- how long the current holder's lease still runs.
--
-- KEYS[1]  lock key   (hash: flag = owner identity, count = depth, fence = token)
-- KEYS[2]  fence key  (string: per-lock fencing counter, never expires)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds (PEXPIRE of the lock key)
-- ARGV[3]  fencing token of the ownership the caller's live guards belong
--          to, or "0" when it has none
-- ARGV[4]  the caller's depth after this acquisition (its live guards + 1)
--
-- Returns {1, fence, depth}  acquired: fresh (depth 1) or re-entered
--         {0, pttl}          held by another identity; pttl is the lock key's
--                            remaining lease in ms (-1 when it has none)
--
-- The depth is set from ARGV, not incremented, so the stored count always
-- mirrors the caller's live guards. A lock that carries the caller's identity
-- but not the token of a live guard is a leftover (a release whose reply was
-- lost): it is taken afresh with a new token instead of being re-entered.
--
-- Errors come before any write: HMGET fails with WRONGTYPE when the lock key
-- is not a hash, INCR when the fence key is not an integer.
-- next_fence() comes from next_fence.lua, prepended when the script is built.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence')

if held[1] == ARGV[1] and held[2] == ARGV[3] then
  redis.call('HSET', KEYS[1], 'count', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(held[2]), tonumber(ARGV[4])}
end

if held[1] == false or held[1] == ARGV[1] then
  local fence = next_fence(KEYS[2])
  redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', 1, 'fence', string.format('%.0f', fence))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

return {0, redis.call('PTTL', KEYS[1])}

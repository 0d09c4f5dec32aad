-- handoff: the holder's last release, passing the lock straight to a waiter
-- of the same process instead of freeing it: no baton, no round trip for the
-- waiter.
--
-- KEYS[1]  lock key   (hash: flag, count, fence)
-- KEYS[2]  fence key  (string: per-lock fencing counter)
-- ARGV[1]  identity of the releasing holder
-- ARGV[2]  fencing token of the holder's ownership
-- ARGV[3]  identity of the waiter that gets the lock
-- ARGV[4]  the waiter's lease in milliseconds
--
-- Returns the new ownership's fencing token, or -1 when the releasing
-- holder does not own the lock (nothing was changed).
-- next_fence() comes from next_fence.lua, prepended when the script is built.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end

local fence = next_fence(KEYS[2])
redis.call('HSET', KEYS[1], 'flag', ARGV[3], 'count', 1, 'fence', string.format('%.0f', fence))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return fence

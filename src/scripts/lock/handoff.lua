-- handoff: the holder's last release, passing the lock straight to a waiter
-- of the same process instead of freeing it: no baton, no round trip for the
-- waiter.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- KEYS[2]  fence key  (string: per-lock fencing counter)
-- ARGV[1]  identity of the releasing holder
-- ARGV[2]  fencing token of the holder's ownership
-- ARGV[3]  identity of the waiter that gets the lock
-- ARGV[4]  the waiter's lease in milliseconds
-- ARGV[5]  TTL of the fence counter in milliseconds
-- ARGV[6]  this request's number (see acquire.lua)
-- ARGV[7]  a quorum's proposed fencing token ("0": none), see next_fence
-- ARGV[8]  tokens to set aside above the new ownership's (see acquire.lua)
--
-- Returns the new ownership's fencing token, or -1 when the releasing
-- holder does not own the lock (nothing was changed).
-- next_fence comes from lib/, prepended when the script is built.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end

local fence, err, token = next_fence(KEYS[2], ARGV[5], ARGV[7], ARGV[8])
if err then
  return err
end
-- The waiter waited, and others may wait behind it: its release wakes one.
redis.call('HSET', KEYS[1], 'flag', ARGV[3], 'count', '1', 'fence', token, 'req', ARGV[6], 'waited', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return fence

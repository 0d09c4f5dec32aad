-- release: release one guard; the last guard frees the lock and hands the
-- baton to one waiter.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- KEYS[2]  baton key  (list holding at most one "ok" token)
-- ARGV[1]  identity of the caller
-- ARGV[2]  fencing token of the caller's ownership
-- ARGV[3]  the caller's live guards after this release (0: this was the last)
-- ARGV[4]  the ownership's lease in milliseconds: an inner release makes
--          the lock live at least this long (never shorter than it would)
-- ARGV[5]  baton TTL in milliseconds
-- ARGV[6]  the hand-over window in milliseconds ("0": none), opened when
--          a waiter of another client found this ownership in its way
--          (lib/hand_over.lua)
-- KEYS[3], ARGV[7], ARGV[8]  where the deployment allows grants (one
--          server, Sentinel without replica acknowledgements): the fence
--          key, the fence counter's TTL in milliseconds, and the prefix of
--          the clients' grant channels. A release that would open a
--          window grants the lock to that window's waiter instead, when
--          the waiter's client hears it (lib/grant.lua).
--
-- Returns -1     the caller does not own the lock (its lease ran out, or it was
--                force-unlocked); nothing was changed. The fence is part of
--                the check: a thread whose lock was lost and which took the
--                lock again must not release the new ownership with a guard
--                of the old one.
--         depth  > 0: an inner guard was released, the lock is still held
--         0      the lock was freed (and the baton pushed if anyone asked
--                for the lock meanwhile: the `waited` mark, see acquire.lua),
--                or granted to a waiter
--
-- The depth is set from ARGV, not decremented, so sending the same release
-- twice leaves the same state: a release never takes off two levels.
-- The script as built begins with lock/usual/release.lua, which reads the
-- lock (`held`), checks the owner and frees an ownership nobody asked for;
-- then extend_lease, baton_error, push_baton, hand_over, next_fence and
-- grant come from lib/, and this file, the other paths.
local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[1], 'count', depth)
  extend_lease(KEYS[1], ARGV[4])
  return depth
end

local err = baton_error(KEYS[2])
if err then
  return err
end
redis.call('DEL', KEYS[1])
if held[4] then
  -- Granted: the waiter holds it, and its release pushes the baton for
  -- the others (`waited`).
  local req, lease, reserve = grant_spec(held[6] or '')
  if req and KEYS[3] and grant(KEYS[1], KEYS[2], KEYS[3], ARGV[7], ARGV[8], held[4], req, lease, reserve, ';') then
    return 0
  end
  hand_over(KEYS[1], ARGV[6], held[4], held[5])
end
push_baton(KEYS[2], ARGV[5])
return 0

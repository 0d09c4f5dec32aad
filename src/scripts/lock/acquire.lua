-- acquire: take a free lock, re-enter a lock this thread holds, or report
-- how long the current holder's lease still runs.
--
-- KEYS[1]  lock key   (hash: flag = owner identity, count = depth,
--                      fence = token, req = the request that created it)
-- KEYS[2]  fence key  (string: per-lock fencing counter)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds: of this acquisition when fresh, of the
--          ownership the caller holds when re-entering
-- ARGV[3]  fencing token of the ownership the caller's live guards belong
--          to, or "0" when it has none
-- ARGV[4]  the caller's depth after this acquisition (its live guards + 1)
-- ARGV[5]  TTL of the fence counter in milliseconds
-- ARGV[6]  this request's number, unique within the caller's client: lets a
--          request whose reply was lost be undone (release_request.lua)
-- ARGV[7]  how the caller asks: the microseconds it has been asking when
--          it has been waiting for the lock (others may wait behind it),
--          "-1" when it will not wait (a try_lock), else "0" (the first
--          attempt of a call that waits if it must); see lib/hand_over.lua
-- ARGV[8]  a quorum's proposed fencing token ("0": none), see next_fence
-- ARGV[9]  tokens to set aside above a fresh ownership's for the caller's
--          process to number in-memory hand-offs with ("0": none), see
--          next_fence
-- ARGV[10] "1" when the lock must be free to be taken: the caller has no
--          live guards, and another thread of its process holds what it
--          took under this identity (it passed the ownership on in
--          memory), so a lock under the caller's identity is that thread's,
--          not a leftover of the caller's
-- KEYS[3], ARGV[11], ARGV[12], ARGV[13]  only from a waiter just out of
--          a park (but a quorum's) or one that may be granted the lock,
--          and left out while the slot migrates: the baton key; "1" from a
--          waiter whose park ended when the baton list changed, with no
--          look that popped its token (the parking hub rings such a waiter
--          at the list's announcement), "0" from another waiter just out
--          of a park, "2" from one that is not; the baton TTL in
--          milliseconds; and, when the caller parks where a grant
--          reaches it (the parking hub of a client that subscribed to its
--          grant channel), the lease in milliseconds of an ownership the
--          release of the one it finds in its way may grant it
--          (lib/grant.lua), else "0". A "1" pops the token, whatever
--          comes of the attempt, as the look would have popped it for this
--          waiter; but a waiter kept out of a window that is still
--          another's alone leaves it there for that waiter, and one whose
--          look popped it ("0") pushes a token back on an empty list (see
--          tell_kept_waiter in lib/hand_over.lua). Neither ever touches a
--          key the script deleted: while the slot migrates, Redis refuses
--          that ("a non local key"), and a missing key sends the whole
--          call back before it runs (TRYAGAIN).
--
-- Returns {1, fence, depth}  acquired: fresh (depth 1) or re-entered
--         {0, pttl}          held by another identity; pttl is the lock key's
--                            remaining lease in ms (-1 when it has none)
--         {0, pttl, -1}      in its hand-over window for pttl ms more, kept
--                            for a caller that asked before this one
--
-- `waited` marks an ownership whose release must push a baton: an attempt
-- that finds the lock held sets it (the caller may park next), and so does
-- a caller that acquires after waiting (others may still be parked). A
-- release of an ownership nobody asked for in the meantime pushes nothing:
-- the uncontended cycle does not pay for waking nobody. The mark is never
-- cleared while the key lives. `seen` marks only the former (another caller
-- found this ownership in its way): a quorum's undo of a minority grant
-- wakes a waiter only then (release_request.lua). `queued` marks an
-- ownership a caller of another client that has waited found in its way,
-- with the identity of the one asking longest (and `since`, when it began):
-- its release opens the hand-over window, kept for that caller
-- (lib/hand_over.lua).
--
-- The depth is set from ARGV, not incremented, so the stored count always
-- mirrors the caller's live guards. Re-entry never shortens the lease
-- (extend_lease). A lock that carries the caller's identity but not the
-- token of a live guard is a leftover (a release whose reply was lost): it
-- is taken afresh with a new token instead of being re-entered.
--
-- A lock in its hand-over window (`handover`, see lib/hand_over.lua) is
-- free to the waiter it is kept for (`for`) and to a caller that will not
-- wait, after its first moments (from the start, to a quorum's caller) also
-- to a caller that asked before it opened, and held for its time left to
-- anyone else.
--
-- Errors come before any write but a waiter's pop of its token: HMGET
-- fails with WRONGTYPE when the lock key is not a hash, then the pop when
-- the baton key is not a list, next_fence when the fence key is not an
-- integer.
-- The script as built begins with lib/next_fence.lua and
-- lock/usual/acquire.lua, which reads the lock (`held`) and takes a lock
-- free outside a window; then extend_lease, may_take, tell_kept_waiter,
-- mark_next, take_window and mark_in_the_way come from lib/, and this
-- file, the other paths.
local pops = ARGV[11] == '1'

local asking = tonumber(ARGV[7])
local may, kept = true, false
if held[3] then
  -- A quorum's caller (it proposes a token) is not kept out of a window
  -- that is still its waiter's alone: it would park through the window as
  -- through a hold, its time left, were that waiter not to come.
  local kept_since = ARGV[8] == '0' and held[5]
  may, kept = may_take(held[3], held[4], kept_since, asking, ARGV[1])
end
-- A token this waiter was rung for stays for the waiter a window is kept
-- for; one a look popped for it goes back (tell_kept_waiter).
if pops and not kept then
  redis.call('LPOP', KEYS[3])
end
if not may then
  if kept and ARGV[11] == '0' then
    tell_kept_waiter(KEYS[3], ARGV[12])
  end
  mark_next(KEYS[1], held[4], held[7], ARGV[1], asking)
  return {0, redis.call('PTTL', KEYS[1]), -1}
end

if held[1] == ARGV[1] and held[2] == ARGV[3] then
  redis.call('HSET', KEYS[1], 'count', ARGV[4])
  extend_lease(KEYS[1], ARGV[2])
  return {1, tonumber(held[2]), tonumber(ARGV[4])}
end

-- Free, in its window (lock/usual/acquire.lua took a lock free outside one).
if held[1] == false or (held[1] == ARGV[1] and ARGV[10] ~= '1') then
  local fence, err, token = next_fence(KEYS[2], ARGV[5], ARGV[8], ARGV[9])
  if err then
    return err
  end
  take_window(KEYS[1], ARGV[1], token, ARGV[6], asking, held[6], held[7])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

-- A waiter that parks where a grant reaches it (ARGV[13]) may be granted
-- the lock by its release: the mark names this request, the grant's lease
-- and the waiter's reserve (lib/grant.lua).
local grant = nil
if ARGV[13] and ARGV[13] ~= '0' then
  grant = ARGV[6] .. ' ' .. ARGV[13] .. ' ' .. ARGV[9]
end
mark_in_the_way(KEYS[1], held[1], held[8], held[5], ARGV[1], asking, grant)
return {0, redis.call('PTTL', KEYS[1])}

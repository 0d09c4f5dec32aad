-- release_request: undo an ownership that a request whose reply was lost
-- may have created (an acquire or a hand-off that timed out), so that the
-- lock is not held by nobody's guard until its lease ends. The client sends
-- it in the background once Redis answers again.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- KEYS[2]  baton key  (list holding at most one "ok" token)
-- ARGV[1]  identity the request was made for
-- ARGV[2]  the request's number (ARGV[6] of acquire.lua and handoff.lua)
-- ARGV[3]  baton TTL in milliseconds
-- ARGV[4]  "1": wake a waiter only if another caller found this ownership
--          in its way (the `seen` mark, see acquire.lua); "0": always
--
-- Returns 1 when the request's ownership was found and freed (baton
-- pushed unless ARGV[4] spared it), 0 when the lock is not that ownership:
-- the request never ran, or the same thread has since taken the lock afresh
-- under another request, or someone else holds it. Safe to send any number
-- of times.
--
-- ARGV[4] is a quorum's undo of a round it lost (a minority of grants):
-- the lock was never that caller's, so only a waiter that parked because
-- of this grant is owed a wake-up. Waking others would send them into the
-- same lost round (the winner holds the other masters) and its undo, which
-- would wake them again: a storm for as long as the winner holds the lock.
-- baton_error and push_baton come from lib/.
local held = redis.call('HMGET', KEYS[1], 'flag', 'req', 'seen')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
local err = baton_error(KEYS[2])
if err then
  return err
end
redis.call('DEL', KEYS[1])
if ARGV[4] ~= '1' or held[3] then
  push_baton(KEYS[2], ARGV[3])
end
return 1

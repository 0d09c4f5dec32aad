-- fair/wake: wake one fair-lock waiter, the head its lock's release (or
-- undo, forced release, leaving waiter) named: one token on the list it
-- parks on, its own or the head's list (a waiter's whose list is not
-- known gets one on each, a call each: one key per call, which a
-- migrating slot's node serves or redirects whole).
--
-- KEYS[1]  the list (LockKeys::wake_list, or FairKeys::next)
-- ARGV[1]  baton TTL in milliseconds
--
-- Returns 1. baton_error and push_baton come from lib/.
local err = baton_error(KEYS[1])
if err then
  return err
end
push_baton(KEYS[1], ARGV[1])
return 1

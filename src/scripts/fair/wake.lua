-- fair/wake: wake one fair-lock waiter, the head its lock's release (or
-- undo, forced release, leaving waiter) named: one token on its own list.
--
-- KEYS[1]  the waiter's list (`<wake prefix>:<identity>`, LockKeys::wake_list)
-- ARGV[1]  baton TTL in milliseconds
--
-- Returns 1. baton_error and push_baton come from lib/.
local err = baton_error(KEYS[1])
if err then
  return err
end
push_baton(KEYS[1], ARGV[1])
return 1

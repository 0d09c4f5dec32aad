-- latch/set_count: starts a round of the count-down latch at `count`,
-- unless the current round is still counting.
--
-- KEYS[1]  count key    (string: what is left to count down; absent = 0)
-- KEYS[2]  baton key    (list: the token that wakes waiters at zero)
-- KEYS[3]  applied key  (set: the count-downs of this round already counted)
-- ARGV[1]  the count, at least 1
--
-- Returns 1 when the round started, 0 when the count is still above zero
-- (nothing changed). A leftover token of the previous round is removed, so
-- that it wakes no waiter of this one.
-- latch_count comes from lib/.
local count, err = latch_count(KEYS[1])
if err then
  return err
end
if count > 0 then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SET', KEYS[1], ARGV[1])
return 1

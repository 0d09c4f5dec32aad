-- latch/set_count: starts a round of the count-down latch at `count`,
-- unless the current round is still counting.
--
-- KEYS[1]  count key    (string: what is left to count down; absent = 0)
-- KEYS[2]  round key    (string: the round's id)
-- KEYS[3]  applied key  (set: the count-downs of this round already counted)
-- ARGV[1]  the count, at least 1
-- ARGV[2]  the new round's id, unique per call of the client
--
-- Returns 1 when the round started, 0 when the count is still above zero
-- (nothing changed). A call sent twice (its reply lost) finds its own round
-- id and says 1 again, whether that round is still counting or has ended
-- meanwhile: it never starts a second round.
--
-- The last round's baton key is left alone: its token (with its TTL) still
-- has to reach every waiter of that round, and a waiter of this round parks
-- on a key of its own.
-- latch_state comes from lib/.
local count, round, err = latch_state(KEYS[1], KEYS[2])
if err then
  return err
end
if round == ARGV[2] then
  return 1
end
if count > 0 then
  return 0
end
redis.call('DEL', KEYS[3])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1

-- latch/wait: whether the latch is open for a waiter: its count is zero,
-- or the round the waiter started in has ended (a new one may have started
-- since).
--
-- KEYS[1]  count key  (string; absent = 0)
-- KEYS[2]  round key  (string)
-- KEYS[3]  baton key of round ARGV[1] (list); only when ARGV[2] is "1"
-- ARGV[1]  the waiter's round id, "" for a first look
-- ARGV[2]  "1" when the caller was parked (it may have taken the token)
-- ARGV[3]  baton TTL in milliseconds
--
-- Returns {1} when open, {0, round id} when the round is still counting.
--
-- Every process parks one thread per latch and round in BLPOP on the
-- round's baton key. When the count reaches zero, count_down.lua pushes one
-- token there; each parked waiter that finds its round over pushes it back
-- before leaving, so the next parked one (Redis serves the longest-blocked
-- first) wakes too, and so on through every process. A waiter that checks
-- just as the count hits zero either sees it here or finds the token when
-- it parks. A new round neither removes the token nor wakes on it: its
-- waiters park on a key of their own, and the last round's waiters see
-- their round ended whatever came after.
-- latch_state and pass_token come from lib/.
local count, round, err = latch_state(KEYS[1], KEYS[2])
if err then
  return err
end
if count > 0 and (ARGV[1] == '' or round == ARGV[1]) then
  return {0, round}
end
if ARGV[2] == '1' and KEYS[3] then
  pass_token(KEYS[3], ARGV[3])
end
return {1}

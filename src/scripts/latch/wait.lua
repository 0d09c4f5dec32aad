-- latch/wait: whether the latch is open (its count is zero), for a waiter.
--
-- KEYS[1]  count key  (string; absent = 0)
-- KEYS[2]  baton key  (list)
-- ARGV[1]  "1" when the caller was parked (it may have taken the token)
-- ARGV[2]  baton TTL in milliseconds
--
-- Returns 1 when open, 0 when the count is above zero.
--
-- Every process parks one thread per latch in BLPOP on the baton key. When
-- the count reaches zero, count_down.lua pushes one token; each parked
-- waiter that finds the latch open pushes it back before leaving, so the
-- next parked one (Redis serves the longest-blocked first) wakes too, and
-- so on through every process. A waiter that checks just as the count hits
-- zero either sees zero here or finds the token when it parks: no wake-up
-- is lost.
-- latch_count comes from lib/.
local count, err = latch_count(KEYS[1])
if err then
  return err
end
if count > 0 then
  return 0
end
if ARGV[1] == '1' then
  redis.call('RPUSH', KEYS[2], 'open')
  redis.call('LTRIM', KEYS[2], 0, 0)
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1

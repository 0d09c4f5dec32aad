-- latch/count_down: counts one down; the count reaching zero ends the
-- round, wakes every waiter (a token each woken waiter passes on, see
-- latch/wait.lua) and removes the round's keys.
--
-- KEYS[1]  count key    (string; absent = 0)
-- KEYS[2]  baton key    (list)
-- KEYS[3]  applied key  (set of count-down ids counted this round)
-- ARGV[1]  this count-down's id (unique per call of the client), so that a
--          count-down sent twice (its connection dropped before the reply)
--          counts once
-- ARGV[2]  baton TTL in milliseconds
--
-- Returns the count left (0 once open; a count-down of an open latch
-- changes nothing).
-- latch_count comes from lib/.
local count, err = latch_count(KEYS[1])
if err then
  return err
end
if count == 0 then
  return 0
end
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then
  return count
end
count = redis.call('DECR', KEYS[1])
if count > 0 then
  return count
end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('RPUSH', KEYS[2], 'open')
redis.call('LTRIM', KEYS[2], 0, 0)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 0

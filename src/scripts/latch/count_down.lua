-- latch/count_down: counts one down in round `round`; the count reaching
-- zero ends the round and wakes every waiter of it (a token each woken
-- waiter passes on, see latch/wait.lua).
--
-- KEYS[1]  count key    (string; absent = 0)
-- KEYS[2]  round key    (string: the current round's id)
-- KEYS[3]  applied key  (set of count-down ids counted this round)
-- KEYS[4]  baton key of round ARGV[2] (list)
-- ARGV[1]  this count-down's id (unique per call of the client), so that a
--          count-down sent twice (its connection dropped before the reply)
--          counts once
-- ARGV[2]  the round this count-down is meant for (the client read it just
--          before): a count-down sent again after that round ended never
--          counts in the next one
-- ARGV[3]  baton TTL in milliseconds
-- ARGV[4]  how long the id of an ended round is kept, in milliseconds (so
--          that a set_count sent twice recognises its round)
--
-- Returns the count left (0 once open; a count-down of an open latch, or
-- of a round that has ended, changes nothing).
-- latch_state and pass_token come from lib/.
local count, round, err = latch_state(KEYS[1], KEYS[2])
if err then
  return err
end
if count == 0 or round ~= ARGV[2] then
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
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
pass_token(KEYS[4], ARGV[3])
return 0

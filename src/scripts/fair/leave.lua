-- fair/leave: a waiter that gave up (its deadline passed) leaves the queue
-- at once instead of holding its place until it expires.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue
-- KEYS[3]  places
-- ARGV[1]  identity of the waiter
--
-- Returns {had, head}: had is 1 when the waiter had a place, 0 otherwise;
-- head is the waiter to wake ('' for none): the new head when the lock is
-- free (fair/wake.lua pushes its list). Safe to send twice.
-- The queue helpers come from lib/.
local queue, places = KEYS[2], KEYS[3]
local err = queue_error(queue, places)
if err then
  return err
end
local had = redis.call('ZREM', queue, ARGV[1])
redis.call('ZREM', places, ARGV[1])
if had == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  return {had, head_to_wake(queue, places)}
end
return {had, ''}

-- fair/leave: a waiter that gave up (its deadline passed) leaves the queue
-- at once instead of holding its place until it expires; if the lock is
-- free, the new head is woken.
--
-- KEYS[1]  lock key
-- KEYS[2]  prefix of the waiters' lists (`<prefix>:<identity>`)
-- ARGV[1]  identity of the waiter
-- ARGV[2]  baton TTL in milliseconds
--
-- Returns 1 when the waiter had a place, 0 otherwise. Safe to send twice.
-- The queue helpers come from lib/.
local queue, places = fair_keys(KEYS[1])
local err = queue_error(KEYS[1])
if err then
  return err
end
local had = redis.call('ZREM', queue, ARGV[1])
redis.call('ZREM', places, ARGV[1])
if had == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  wake_head(KEYS[1], KEYS[2], ARGV[2])
end
return had

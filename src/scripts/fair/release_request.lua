-- fair/release_request: lock/release_request.lua for the fair lock: undo
-- the ownership a request whose reply was lost may have created.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- KEYS[2]  queue
-- KEYS[3]  places
-- ARGV[1]  identity the request was made for
-- ARGV[2]  the request's number (ARGV[6] of fair/acquire.lua)
--
-- Returns {freed, head}: freed is 1 when the request's ownership was found
-- and freed, 0 when the lock is not that ownership; head is the waiter to
-- wake ('' for none). Safe to send any number of times.
-- The queue helpers come from lib/.
local held = redis.call('HMGET', KEYS[1], 'flag', 'req')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return {0, ''}
end
local err = queue_error(KEYS[2], KEYS[3])
if err then
  return err
end
redis.call('DEL', KEYS[1])
return {1, head_to_wake(KEYS[2], KEYS[3])}

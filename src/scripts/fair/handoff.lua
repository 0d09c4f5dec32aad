-- fair/handoff: the holder's last release, passing the fair lock straight
-- to a waiter of the same process that is the head of the queue, instead
-- of freeing it: the waiter is woken in memory already holding it, with no
-- attempt of its own.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req, waited), as acquire.lua
-- KEYS[2]  fence key  (string: per-lock fencing counter)
-- KEYS[3]  queue      (sorted set: waiter -> arrival, server µs)
-- KEYS[4]  places     (sorted set: waiter -> end of its place, server ms)
-- ARGV[1]  identity of the releasing holder
-- ARGV[2]  fencing token of the holder's ownership
-- ARGV[3]  identity of the waiter that gets the lock
-- ARGV[4]  the waiter's lease in milliseconds
-- ARGV[5]  TTL of the fence counter in milliseconds
-- ARGV[6]  this request's number (see acquire.lua): a hand-off whose reply
--          was lost is undone by it (release_request.lua)
--
-- Returns {fence, next}  handed over: the waiter's fencing token, and the
--                        head of the queue behind it ('' when nobody
--                        waits), whom its release will likely wake
--         {-1}           the releasing holder does not own the lock
--         {0}            the waiter is not the head of the queue (its place
--                        ended, or one who came back to an earlier place is
--                        ahead of it): nothing was changed, and the holder
--                        releases as usual
--
-- Only the head is handed the lock, so arrival order holds across
-- processes exactly as when the waiter takes it in its own attempt. Like
-- that attempt, the hand-off drops the waiter's place. A waiter that does
-- not learn of it (the reply was lost) finds the lock under its identity
-- at its next attempt and takes it afresh (fair/acquire.lua).
-- next_fence and the queue helpers come from lib/, prepended when the
-- script is built.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return {-1}
end
local queue, places = KEYS[3], KEYS[4]
local err = queue_error(queue, places)
if err then
  return err
end
drop_dead_waiters(queue, places, server_ms())
local first = redis.call('ZRANGE', queue, 0, 1)
if first[1] ~= ARGV[3] then
  return {0}
end
local fence, ferr, token = next_fence(KEYS[2], ARGV[5])
if ferr then
  return ferr
end
-- No key is read after a write may have deleted it (the waiter's place
-- the last of the queue), nor deleted and written again (the lock): while
-- the slot migrates, Redis refuses a script's command on a key the node
-- does not have, after the writes before it.
redis.call('ZREM', queue, ARGV[3])
redis.call('ZREM', places, ARGV[3])
-- Nothing of the holder's ownership (a `next`, its marks) stays.
redis.call('HDEL', KEYS[1], 'next', 'nspec', 'waited')
redis.call('HSET', KEYS[1], 'flag', ARGV[3], 'count', '1', 'fence', token, 'req', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if first[2] then
  redis.call('HSET', KEYS[1], 'waited', '1')
  return {fence, first[2]}
end
return {fence, ''}

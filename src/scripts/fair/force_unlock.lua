-- fair/force_unlock: administrative release of a fair lock, whoever holds
-- it and at any depth; names the head of the queue, to be woken.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- KEYS[2]  queue
-- KEYS[3]  places
--
-- Returns {removed, head}: removed is 1 when a lock was removed, 0 when it
-- was already free; head is the waiter to wake ('' for none).
-- The queue helpers come from lib/.
local lock_type = redis.call('TYPE', KEYS[1])['ok']
if lock_type == 'none' then
  return {0, ''}
end
if lock_type ~= 'hash' then
  return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' holds a ' .. lock_type .. ', not a hash')
end
local err = queue_error(KEYS[2], KEYS[3])
if err then
  return err
end
redis.call('DEL', KEYS[1])
return {1, head_to_wake(KEYS[2], KEYS[3])}

-- fair/acquire: take the fair lock in arrival order, re-enter it, or take
-- (and keep) a place in its queue of waiters.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req, waited), as acquire.lua
-- KEYS[2]  fence key  (string: per-lock fencing counter)
-- ARGV[1]..ARGV[6]  as acquire.lua: identity, lease ms, held fence, depth,
--                   fence counter TTL ms, request number
-- ARGV[7]  "1" when the caller waits: it takes or renews its place in the
--          queue; "0" for a single attempt (try_lock), which takes no place
-- ARGV[8]  how long a place lives without being renewed, in ms
--
-- Returns {1, fence, depth}  acquired: fresh (depth 1) or re-entered
--         {0, wait}          not this caller's turn; `wait` is how long, in
--                            ms, until something may change without a
--                            wake-up: the holder's remaining lease, or, for
--                            a free lock with others ahead, the end of the
--                            head's place (-1: no expiry)
--
-- The lock is free for the caller only when nobody waits ahead of it: the
-- queue is empty or the caller is its head. A newcomer never barges past a
-- waiter. The queue lives next to the lock key (fair_queue.lua); dead
-- waiters' places are dropped first. An ownership taken while others wait
-- carries the `waited` mark, so that its release wakes the new head.
-- next_fence, extend_lease and the queue helpers come from lib/.
local queue, places = fair_keys(KEYS[1])
local err = queue_error(KEYS[1])
if err then
  return err
end
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence')

if held[1] == ARGV[1] and held[2] == ARGV[3] then
  redis.call('HSET', KEYS[1], 'count', ARGV[4])
  extend_lease(KEYS[1], ARGV[2])
  return {1, tonumber(held[2]), tonumber(ARGV[4])}
end

local now = server_ms()
drop_dead_waiters(queue, places, now)
local head = redis.call('ZRANGE', queue, 0, 0)[1]

if (held[1] == false or held[1] == ARGV[1]) and (head == nil or head == ARGV[1]) then
  local fence, ferr = next_fence(KEYS[2], ARGV[5])
  if ferr then
    return ferr
  end
  redis.call('ZREM', queue, ARGV[1])
  redis.call('ZREM', places, ARGV[1])
  local token = string.format('%.0f', fence)
  redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', 1, 'fence', token, 'req', ARGV[6])
  if redis.call('ZCARD', queue) > 0 then
    redis.call('HSET', KEYS[1], 'waited', 1)
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

if ARGV[7] == '1' then
  if not redis.call('ZSCORE', queue, ARGV[1]) then
    local now_us = redis.call('TIME')
    redis.call('ZADD', queue, tonumber(now_us[1]) * 1000000 + tonumber(now_us[2]), ARGV[1])
  end
  redis.call('ZADD', places, now + tonumber(ARGV[8]), ARGV[1])
  if held[1] then
    redis.call('HSET', KEYS[1], 'waited', 1)
  end
end

if held[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
-- Free, but the head (another waiter) has not taken it yet: it was woken;
-- look again when its place would end, in case it died meanwhile.
local head_place = tonumber(redis.call('ZSCORE', places, head) or now)
return {0, math.max(head_place - now, 1)}

-- The fair lock's queue of waiters: KEYS `queue` (sorted set: waiter
-- identity, scored by its arrival in server µs) and `places` (sorted set:
-- waiter identity, scored by the server time in ms when its place ends
-- unless it comes back). A waiter renews its place at each attempt, so a
-- dead one's place ends within about one park slice and never blocks the
-- queue. Every script passes both keys in its KEYS: nothing here builds a
-- key name. Prepended to the fair lock's scripts.

-- server_ms(): the server's clock in milliseconds (never a client's).
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- queue_error(queue, places): an error reply when either key holds
-- something other than a sorted set, else nil; checked before any write.
local function queue_error(queue, places)
  for _, key in ipairs({queue, places}) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'zset' and kind ~= 'none' then
      return redis.error_reply('WRONGTYPE fair lock key ' .. key .. ' holds a ' .. kind .. ', not a sorted set')
    end
  end
  return nil
end

-- drop_dead_waiters(queue, places, now): removes the waiters whose place
-- ended by `now`.
local function drop_dead_waiters(queue, places, now)
  local dead = redis.call('ZRANGEBYSCORE', places, '-inf', now)
  for _, waiter in ipairs(dead) do
    redis.call('ZREM', queue, waiter)
    redis.call('ZREM', places, waiter)
  end
end

-- head_to_wake(queue, places): the identity of the oldest live waiter,
-- or '' when nobody waits. The script returns it, and the client pushes
-- that waiter's own list in a second call that names the list in its
-- KEYS (a key chosen here could not be declared up front).
local function head_to_wake(queue, places)
  drop_dead_waiters(queue, places, server_ms())
  return redis.call('ZRANGE', queue, 0, 0)[1] or ''
end

-- keep_queue(queue, places, ms): both keys live at least `ms` more (never
-- less than they already would), so that they expire after their last
-- use even when every waiter died; a place is never older than that.
local function keep_queue(queue, places, ms)
  for _, key in ipairs({queue, places}) do
    local left = redis.call('PTTL', key)
    if left == -1 or (left >= 0 and left < tonumber(ms)) then
      redis.call('PEXPIRE', key, ms)
    end
  end
end

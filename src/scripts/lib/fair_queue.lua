-- The fair lock's queue of waiters, next to its lock key: `<lock>:queue`
-- (sorted set: waiter identity, scored by its arrival) and `<lock>:places`
-- (sorted set: waiter identity, scored by the server time in ms when its
-- place expires unless it comes back). A waiter renews its place at each
-- attempt, so a dead one's place ends within a park slice and never blocks
-- the queue. Prepended to the fair lock's scripts.

-- fair_keys(lock_key): the queue and places keys of a fair lock.
local function fair_keys(lock_key)
  return lock_key .. ':queue', lock_key .. ':places'
end

-- server_ms(): the server's clock in milliseconds (never a client's).
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- drop_dead_waiters(queue, places, now): removes the waiters whose place
-- expired by `now`.
local function drop_dead_waiters(queue, places, now)
  local dead = redis.call('ZRANGEBYSCORE', places, '-inf', now)
  for _, waiter in ipairs(dead) do
    redis.call('ZREM', queue, waiter)
    redis.call('ZREM', places, waiter)
  end
end

-- queue_error(lock_key): an error reply when the queue or places key holds
-- something other than a sorted set, else nil; checked before any write.
local function queue_error(lock_key)
  local queue, places = fair_keys(lock_key)
  for _, key in ipairs({queue, places}) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'zset' and kind ~= 'none' then
      return redis.error_reply('WRONGTYPE fair lock key ' .. key .. ' holds a ' .. kind .. ', not a sorted set')
    end
  end
  return nil
end

-- wake_head(lock_key, prefix, ttl): pushes one token on the list of the
-- oldest live waiter (`<prefix>:<identity>`), so that exactly that waiter
-- wakes; nothing when nobody waits.
local function wake_head(lock_key, prefix, ttl)
  local queue, places = fair_keys(lock_key)
  drop_dead_waiters(queue, places, server_ms())
  local head = redis.call('ZRANGE', queue, 0, 0)
  if head[1] then
    local list = prefix .. ':' .. head[1]
    redis.call('RPUSH', list, 'ok')
    redis.call('LTRIM', list, 0, 0)
    redis.call('PEXPIRE', list, ttl)
  end
end

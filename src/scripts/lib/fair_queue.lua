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

-- not_a_queue(key, command, failed): the error reply for `key`, which a
-- read (`command`) failed on with the error `failed` (a pcall's): naming
-- the key where it holds something other than a sorted set, else
-- `failed` with the command and the key (a caught error names neither,
-- as a raised one names the script's line), its code kept first.
local function not_a_queue(key, command, failed)
  if string.sub(failed.err, 1, 9) == 'WRONGTYPE' then
    local kind = redis.call('TYPE', key)['ok']
    return redis.error_reply('WRONGTYPE fair lock key ' .. key .. ' holds a ' .. kind .. ', not a sorted set')
  end
  return redis.error_reply(failed.err .. ' (' .. command .. ' on ' .. key .. ')')
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

-- read_queue(queue, places, now, first): reads only, before a script's
-- first write: the waiters whose place ended by `now` (a list) and the
-- first `first` live waiters of the queue (a list); or nil and an error
-- reply, naming the key, when either key holds something other than a
-- sorted set. It asks no TYPE: each call a script makes costs it about
-- as much as a cheap command's own work, so the reads themselves find a
-- wrong type (`redis.pcall`); another error is the script's as it is.
local function read_queue(queue, places, now, first)
  local dead = redis.pcall('ZRANGEBYSCORE', places, '-inf', now)
  if dead.err then
    return nil, nil, not_a_queue(places, 'ZRANGEBYSCORE', dead)
  end
  local waiting = redis.pcall('ZRANGE', queue, 0, first - 1 + #dead)
  if waiting.err then
    return nil, nil, not_a_queue(queue, 'ZRANGE', waiting)
  end
  if #dead == 0 then
    return dead, waiting
  end
  local dropping, live = {}, {}
  for _, waiter in ipairs(dead) do
    dropping[waiter] = true
  end
  for _, waiter in ipairs(waiting) do
    if not dropping[waiter] and #live < first then
      live[#live + 1] = waiter
    end
  end
  return dead, live
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

-- head_after_drops(queue, places, from): reads only. The head the queue
-- has once the places to drop are dropped ('' for none), and those places:
-- dead waiters' (as drop_dead_waiters), and those of the waiters named in
-- ARGV from `from` on, in pairs (waiter, arrival), that a run passed the
-- lock to in memory, whose places stayed in the queue. Such a place is
-- dropped only while it still has that arrival: a waiter that asked again
-- since has a new place, which stays. Reading everything first, the
-- script reads no key after a write may have deleted it (while the slot
-- migrates, Redis refuses that, after the writes before it).
local function head_after_drops(queue, places, from)
  local drop, dropping = {}, {}
  for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', places, '-inf', server_ms())) do
    drop[#drop + 1] = waiter
    dropping[waiter] = true
  end
  for i = from, #ARGV - 1, 2 do
    local waiter = ARGV[i]
    local arrival = redis.call('ZSCORE', queue, waiter)
    if not dropping[waiter] and arrival and tonumber(arrival) == tonumber(ARGV[i + 1]) then
      drop[#drop + 1] = waiter
      dropping[waiter] = true
    end
  end
  -- Of the first #drop + 1 waiters, one at least stays (if any does).
  for _, waiter in ipairs(redis.call('ZRANGE', queue, 0, #drop)) do
    if not dropping[waiter] then
      return waiter, drop
    end
  end
  return '', drop
end

-- drop_places(queue, places, drop): drops the places head_after_drops
-- named.
local function drop_places(queue, places, drop)
  if #drop > 0 then
    redis.call('ZREM', queue, unpack(drop))
    redis.call('ZREM', places, unpack(drop))
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

-- line_of(waiting, waiter, most): the waiters after `waiter` in `waiting`
-- (the first of the queue, `ZRANGE ... WITHSCORES`, `waiter` among them)
-- that an ownership `waiter` takes may pass along in memory: the first of
-- them while they are threads of its client, up to `most`, as {waiter,
-- arrival, ...} (arrivals as the reply gave them); then the waiter after
-- that line (nil when the line took all `waiting` had), and the first
-- waiter after `waiter` (nil: nobody waits behind it).
local function line_of(waiting, waiter, most)
  local client = string.match(waiter, '^(.*:)')
  local line, after, first = {}, nil, nil
  for i = 1, #waiting, 2 do
    local other = waiting[i]
    if other ~= waiter then
      first = first or other
      if #line == 2 * most or not client or string.sub(other, 1, #client) ~= client then
        after = other
        break
      end
      line[#line + 1] = other
      line[#line + 1] = waiting[i + 1]
    end
  end
  if #line == 0 then
    after = nil
  end
  return line, after, first
end

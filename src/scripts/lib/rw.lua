-- Helpers of the read-write lock's scripts (rwlock/*.lua): the server's
-- clock, forgetting ended leases and places, expiries that follow them,
-- and a reader's stored hold.
--
-- Readers live in a sorted set (identity -> end of its lease, server ms)
-- with a hash beside it (identity -> "<depth>:<token>"); waiting writers in
-- a sorted set (identity -> end of its place, server ms). Every script
-- purges what has ended before it looks (purge; a read and its release
-- look at the writers through first_place), so a dead reader or a dead
-- waiting writer stops counting when its lease or place ends, without
-- anyone's release.

-- Numbers are formatted with '%d', not '%.0f' or tostring: formatting a
-- float costs a script more than a Redis call does. Every number formatted
-- here is whole: the server's clock in ms (now_ms) plus or minus durations
-- the client sends as whole ms (at most a year, see config.rs), or scores
-- written that way; about 2^41, far below 2^53 (exact in a double) and 2^63
-- ('%d' formats a C long). It is written out at each use rather than as a
-- helper: every helper here is a closure made on every run of every script
-- (one referenced by the others costs a script about 1k instructions).

-- now_ms(): the server's clock in milliseconds (TIME), never a client's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- purge(readers, depths, writers, now): forget readers whose lease has
-- ended (and their depth), and waiting writers whose place has ended
-- (`writers` nil: the caller looks at them with first_place instead).
-- Reads the readers set first, so a damaged key fails before any write.
local function purge(readers, depths, writers, now)
  local ended = redis.call('ZRANGEBYSCORE', readers, '-inf', now)
  for i = 1, #ended, 100 do
    redis.call('HDEL', depths, unpack(ended, i, math.min(i + 99, #ended)))
  end
  if #ended > 0 then
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
  end
  if writers then
    redis.call('ZREMRANGEBYSCORE', writers, '-inf', now)
  end
end

-- first_place(writers, now): the first waiting writer's place and its end
-- (ZRANGE 0 0 WITHSCORES; empty when nobody waits), the places that have
-- ended forgotten first. The set is ordered by the places' ends, so some
-- have ended only if the first has: one call while none has, where
-- purging every time and then looking made two (a read and its release,
-- each uncontended, looked at the writers so).
local function first_place(writers, now)
  local first = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
  if #first > 0 and tonumber(first[2]) <= now then
    redis.call('ZREMRANGEBYSCORE', writers, '-inf', now)
    first = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
  end
  return first
end

-- expire_with(zset, other, now): the sorted set (and `other`, when given)
-- expire when the set's last score passes: the keys never outlive the
-- longest lease or place they hold.
local function expire_with(zset, other, now)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if #last == 0 then
    return
  end
  local ms = string.format('%d', math.max(tonumber(last[2]) - now, 1))
  redis.call('PEXPIRE', zset, ms)
  if other then
    redis.call('PEXPIRE', other, ms)
  end
end

-- read_hold(depths, identity): the depth and token (a string) of
-- identity's read hold, or nil.
local function read_hold(depths, identity)
  local stored = redis.call('HGET', depths, identity)
  if not stored then
    return nil, nil
  end
  local depth, token = string.match(stored, '^(%d+):(%d+)$')
  return tonumber(depth), token
end

-- any_live(zset, now): whether `zset` holds a member whose score (a lease or
-- place end) is still to come: what it holds once purge has run, read
-- without writing, so that a script may decide what it will write (and
-- check only the keys it will write) before its first write.
local function any_live(zset, now)
  return #redis.call('ZRANGEBYSCORE', zset, '(' .. string.format('%d', now), '+inf', 'LIMIT', '0', '1') > 0
end

-- ms_score(now, ms): a lease or place end as a score string.
local function ms_score(now, ms)
  return string.format('%d', now + tonumber(ms))
end

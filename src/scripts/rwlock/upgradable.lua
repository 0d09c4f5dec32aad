-- upgradable: take the upgradable read (a read hold that may later become
-- the write hold without letting a writer in between), re-enter the one
-- this thread holds, or report how long until it is worth looking again.
-- One upgradable reader at a time, beside any number of plain readers.
--
-- KEYS[1]  upgradable key (hash: flag = owner identity, count = depth,
--                          fence = the hold's token, req = the request that
--                          created it, upgrading = end of a waiting
--                          upgrade's mark, rwait = a reader was refused by
--                          that mark, uwait = an upgradable reader was
--                          refused by this hold)
-- KEYS[2]  write key      (hash: flag, count, fence, req, rwait, uwait)
-- KEYS[3]  readers key    (sorted set: identity -> lease end, server ms)
-- KEYS[4]  depths key     (hash: identity -> "<depth>:<token>")
-- KEYS[5]  writers key    (sorted set: waiting writer -> place end, server ms)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds (of this hold, or of the one re-entered)
-- ARGV[3]  token of the caller's live upgradable guards, or "0"
-- ARGV[4]  the caller's depth after this acquisition (its live guards + 1)
-- ARGV[5]  this request's number: the token of a fresh hold (and what
--          undo.lua matches when the reply is lost)
-- ARGV[6]  "1" when the caller has been waiting: others may wait too, so
--          the fresh hold marks `uwait` and its release wakes the next
--
-- Returns {1, token, depth}  acquired: fresh (depth 1) or re-entered, or
--                            this request's own hold when it is sent again
--         {0, wait_ms}       refused: another upgradable reader or a writer
--                            holds (wait_ms = its remaining lease, -1 when
--                            it has none), or a writer waits (wait_ms =
--                            until the earliest waiting writer's place ends)
--
-- Writer preference as for plain readers: while a writer waits, a fresh
-- upgradable reader is refused, unless the caller holds the write lock
-- itself. A refusal by a holder marks `uwait` on its key, so that its
-- release pushes an upgradable baton. Errors come before any write: HMGET
-- fails with WRONGTYPE when the upgradable or write key is not a hash,
-- purge when the readers key is not a sorted set.
-- now_ms, purge (lib/rw.lua) and extend_lease (lib/lease.lua) are
-- prepended.
local up = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'req', 'count')
local writer = redis.call('HMGET', KEYS[2], 'flag')[1]
local now = now_ms()
purge(KEYS[3], KEYS[4], KEYS[5], now)
local id = ARGV[1]

if up[1] == id and up[2] == ARGV[3] then
  redis.call('HSET', KEYS[1], 'count', ARGV[4])
  extend_lease(KEYS[1], ARGV[2])
  return {1, tonumber(up[2]), tonumber(ARGV[4])}
end

-- The same request sent again (its first reply was lost): the hold its
-- first run made, as it is.
if up[1] == id and up[3] == ARGV[5] then
  return {1, tonumber(up[2]), tonumber(up[4])}
end

if up[1] and up[1] ~= id then
  redis.call('HSET', KEYS[1], 'uwait', 1)
  return {0, redis.call('PTTL', KEYS[1])}
end
if writer and writer ~= id then
  redis.call('HSET', KEYS[2], 'uwait', 1)
  return {0, redis.call('PTTL', KEYS[2])}
end
if not writer then
  local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  if #first > 0 then
    return {0, math.max(tonumber(first[2]) - now, 0)}
  end
end

-- A hold of this identity under another token is a leftover (its guards
-- are gone): replaced by the fresh one, which keeps its `uwait` and
-- `rwait` (whoever it refused still waits for this release) but not a
-- waiting upgrade's mark.
redis.call('HSET', KEYS[1], 'flag', id, 'count', 1, 'fence', ARGV[5], 'req', ARGV[5])
redis.call('HDEL', KEYS[1], 'upgrading')
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'uwait', 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, tonumber(ARGV[5]), 1}

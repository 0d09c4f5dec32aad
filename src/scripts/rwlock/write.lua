-- write: take the write hold, re-enter the one this thread holds, or
-- report how long until it is worth looking again (and keep a place in the
-- queue of waiting writers).
--
-- KEYS[1]  write key    (hash: flag = owner identity, count = depth,
--                        fence = token, req = the request that created it,
--                        rwait = a reader was refused meanwhile, uwait = an
--                        upgradable reader was refused meanwhile)
-- KEYS[2]  readers key  (sorted set: identity -> lease end, server ms)
-- KEYS[3]  depths key   (hash: identity -> "<depth>:<token>")
-- KEYS[4]  writers key  (sorted set: waiting writer -> place end, server ms)
-- KEYS[5]  fence key    (string: the fencing counter of write holds)
-- KEYS[6]  upgradable key (hash: flag = the upgradable reader, ...)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds (of this hold, or of the one re-entered)
-- ARGV[3]  fencing token of the caller's live write guards, or "0"
-- ARGV[4]  the caller's depth after this acquisition (its live guards + 1)
-- ARGV[5]  TTL of the fence counter in milliseconds
-- ARGV[6]  this request's number (see undo.lua)
-- ARGV[7]  when refused, keep a place among the waiting writers for this
--          many milliseconds (from the server's clock); "0": no place (the
--          caller will not wait)
-- ARGV[8]  token of the caller's live read guards, or "0"
-- KEYS[7], ARGV[9]  from a waiter whose park ended when the write baton
--          list changed, with no look that popped its token (the parking
--          hub rings such a waiter at the list's announcement): the write
--          baton key, and "1". The token is popped first, whatever comes
--          of the attempt, as the look would have popped it. From a waiter
--          that may be granted (below) and pops nothing: the key, and "0".
-- KEYS[8]  with ARGV[10]: the write grant specs (hash: identity ->
--          "<request> <grant lease ms>")
-- ARGV[10] from a waiter that parks where a release may grant it the write
--          hold (lib/write_grant.lua): the grant's lease in ms; else absent
-- ARGV[11] with ARGV[10]: how long its spec lives, in ms
--
-- Returns {1, fence, depth}  acquired: fresh (depth 1) or re-entered, or
--                            this request's own hold when it is sent again
--         {0, wait_ms}       refused: wait_ms until the writer's lease ends
--                            (-1: it has none) or, while readers or an
--                            upgradable reader hold it, until the last of
--                            their leases ends
--         {0, wait_ms, 1}    refused, a place kept and a grant spec left
--                            (with ARGV[10])
--         {-2}               the caller holds this lock for reading only:
--                            an upgrade, refused (nothing was changed)
--
-- A writer that acquires after keeping a place marks `rwait` and `uwait`,
-- for readers and upgradable readers may have been refused on its
-- account: its release pushes their batons. The upgradable reader (even a
-- leftover of this identity) keeps every writer out: it becomes the writer
-- through upgrade.lua. A waiter that may be granted leaves its spec with
-- its place (the request it parks after, the grant's lease); a writer
-- that takes the hold after keeping a place takes its spec off with the
-- place. Errors come before any write (but a waiter's pop of its token,
-- which fails first when the baton is not a list): HMGET fails with
-- WRONGTYPE when the write or upgradable key is not a hash, purge when the
-- readers key is not a sorted set.
-- now_ms, purge, expire_with, read_hold, ms_score (lib/rw.lua), next_fence
-- and extend_lease (lib/) are prepended.
if ARGV[9] == '1' then
  redis.call('LPOP', KEYS[7])
end
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'req', 'count')
local upgradable = redis.call('HMGET', KEYS[6], 'flag')[1]
local now = now_ms()
purge(KEYS[2], KEYS[3], KEYS[4], now)
local id = ARGV[1]

if held[1] == id and held[2] == ARGV[3] then
  redis.call('HSET', KEYS[1], 'count', ARGV[4])
  extend_lease(KEYS[1], ARGV[2])
  return {1, tonumber(held[2]), tonumber(ARGV[4])}
end

-- The same request sent again (its first reply was lost): the hold its
-- first run made, as it is, rather than a second fresh hold under a new
-- fencing token.
if held[1] == id and held[3] == ARGV[6] then
  return {1, tonumber(held[2]), tonumber(held[4])}
end

local _, token = read_hold(KEYS[3], id)
if token then
  if token == ARGV[8] then
    return {-2}
  end
  -- A leftover read hold of this identity (its guards are gone).
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end

if (held[1] == false or held[1] == id) and not upgradable
    and redis.call('ZCARD', KEYS[2]) == 0 then
  local fence, err, token = next_fence(KEYS[5], ARGV[5])
  if err then
    return err
  end
  if redis.call('ZREM', KEYS[4], id) == 1 then
    redis.call('HSET', KEYS[1], 'flag', id, 'count', 1, 'fence', token, 'req', ARGV[6], 'rwait', 1,
      'uwait', 1)
    expire_with(KEYS[4], nil, now)
    -- Only a writer that kept a place may have left a spec (a writer's
    -- place and spec go together: withdraw.lua, lib/write_grant.lua).
    if KEYS[8] then
      redis.call('HDEL', KEYS[8], id)
    end
  else
    -- A leftover of this identity keeps its `rwait`: readers it refused
    -- still wait for this release.
    redis.call('HSET', KEYS[1], 'flag', id, 'count', 1, 'fence', token, 'req', ARGV[6])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

-- The refusal's third field: 1 when this waiter keeps a place and left a
-- spec, else nil (a reply ends at its first nil: two fields).
local spec = nil
if ARGV[7] ~= '0' then
  redis.call('ZADD', KEYS[4], ms_score(now, ARGV[7]), id)
  expire_with(KEYS[4], nil, now)
  if ARGV[10] and KEYS[8] then
    redis.call('HSET', KEYS[8], id, ARGV[6] .. ' ' .. ARGV[10])
    if redis.call('PTTL', KEYS[8]) < tonumber(ARGV[11]) then
      redis.call('PEXPIRE', KEYS[8], ARGV[11])
    end
    spec = 1
  end
end
if held[1] and held[1] ~= id then
  return {0, redis.call('PTTL', KEYS[1]), spec}
end
local wait = 0
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #last > 0 then
  wait = math.max(tonumber(last[2]) - now, 0)
end
if upgradable then
  local left = redis.call('PTTL', KEYS[6])
  if left < 0 and #last == 0 then
    return {0, -1, spec}
  end
  wait = math.max(wait, left)
end
return {0, wait, spec}

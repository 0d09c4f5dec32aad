-- release_read: release one read guard; the last one ends the hold, and
-- the last reader wakes a waiting writer.
--
-- KEYS[1]  write key       (hash: flag, ...; only its existence is read)
-- KEYS[2]  readers key     (sorted set: identity -> lease end, server ms)
-- KEYS[3]  depths key      (hash: identity -> "<depth>:<token>")
-- KEYS[4]  writers key     (sorted set: waiting writer -> place end)
-- KEYS[5]  write baton key (list)
-- KEYS[6]  upgradable key  (hash: flag = the upgradable reader, upgrading =
--                           end of its waiting upgrade's mark, server ms)
-- KEYS[7]  upgrade baton key (list)
-- ARGV[1]  identity of the caller
-- ARGV[2]  token of the caller's read hold
-- ARGV[3]  the caller's live read guards after this release (0: the last)
-- ARGV[4]  the hold's lease in milliseconds: an inner release makes it live
--          at least this long
-- ARGV[5]  baton TTL in milliseconds
-- ARGV[6]  from a client that gives back a read a writer's release granted
--          to a waiter it did not find parked: the end of the hold's lease
--          the grant wrote (server ms); the hold ends only while its lease
--          still ends then (an attempt of the waiter sent again after its
--          reply was lost takes its own request's hold and moves its end
--          on, see read.lua). Absent or "" for any other release.
-- KEYS[8], KEYS[9], ARGV[7], ARGV[8]  where the deployment allows grants
--          (see release_write.lua): the write grant specs (see write.lua),
--          the fence key, the prefix of the clients' grant channels and
--          the fence's TTL in ms; else absent. The last reader's release
--          then grants the write hold to the first waiting writer when it
--          left a spec (lib/write_grant.lua), and pushes the write baton
--          when not.
--
-- Returns -1     the caller holds no read hold under that token (its lease
--                ran out); nothing was changed
--         depth  > 0: an inner guard was released
--         0      the hold ended; when it was the last reader, writers wait
--                and no writer or upgradable reader holds, a write baton
--                was pushed; when the upgradable reader waits to upgrade
--                and no other reader is left, an upgrade baton was pushed
--
-- now_ms, purge, first_place, expire_with, read_hold, ms_score
-- (lib/rw.lua), baton_error, push_baton, next_fence, publish_grant, first_writer and
-- grant_writer (lib/) are prepended.
local up = redis.call('HMGET', KEYS[6], 'flag', 'upgrading')
local now = now_ms()
purge(KEYS[2], KEYS[3], nil, now)
local id = ARGV[1]
local _, token = read_hold(KEYS[3], id)
if token == nil or token ~= ARGV[2] then
  return -1
end
if (ARGV[6] or '') ~= '' and tonumber(redis.call('ZSCORE', KEYS[2], id)) ~= tonumber(ARGV[6]) then
  return -1
end

local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[3], id, depth .. ':' .. token)
  redis.call('ZADD', KEYS[2], 'GT', ms_score(now, ARGV[4]), id)
  expire_with(KEYS[2], KEYS[3], now)
  return depth
end

-- The batons this release pushes, decided before its first write: only
-- those are checked (a TYPE each), so that a damaged one fails the call with
-- nothing changed, and a release that wakes nobody checks none. purge has
-- run, and first_place forgets ended writer places: every reader left is
-- live, and `writers` counts only live places.
local batons = {}
local writers = not up[1] and #first_place(KEYS[4], now) > 0
local upgrade = up[2] and tonumber(up[2]) > now
if writers or upgrade then
  -- The readers left once this one has gone.
  local left = redis.call('ZCARD', KEYS[2])
  if redis.call('ZSCORE', KEYS[2], id) then
    left = left - 1
  end
  if writers and left == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
    batons[#batons + 1] = KEYS[5]
  end
  if upgrade and (left == 0 or (left == 1 and up[1] ~= id and redis.call('ZSCORE', KEYS[2], up[1]))) then
    batons[#batons + 1] = KEYS[7]
  end
end
for _, baton in ipairs(batons) do
  local err = baton_error(baton)
  if err then
    return err
  end
end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
expire_with(KEYS[2], KEYS[3], now)
for _, baton in ipairs(batons) do
  if not (baton == KEYS[5] and ARGV[8] and grant_writer(first_writer(KEYS[4], now), KEYS[4],
      KEYS[8], KEYS[1], KEYS[9], ARGV[8], ARGV[7], KEYS[5], now)) then
    push_baton(baton, ARGV[5])
  end
end
return 0

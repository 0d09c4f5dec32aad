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
--
-- Returns -1     the caller holds no read hold under that token (its lease
--                ran out); nothing was changed
--         depth  > 0: an inner guard was released
--         0      the hold ended; when it was the last reader, writers wait
--                and no writer or upgradable reader holds, a write baton
--                was pushed; when the upgradable reader waits to upgrade
--                and no other reader is left, an upgrade baton was pushed
--
-- now_ms, purge, expire_with, read_hold, ms_score (lib/rw.lua),
-- baton_error and push_baton (lib/baton.lua) are prepended.
local up = redis.call('HMGET', KEYS[6], 'flag', 'upgrading')
local now = now_ms()
purge(KEYS[2], KEYS[3], KEYS[4], now)
local id = ARGV[1]
local _, token = read_hold(KEYS[3], id)
if token == nil or token ~= ARGV[2] then
  return -1
end

local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[3], id, depth .. ':' .. token)
  redis.call('ZADD', KEYS[2], 'GT', ms_score(now, ARGV[4]), id)
  expire_with(KEYS[2], KEYS[3], now)
  return depth
end

for _, baton in ipairs({KEYS[5], KEYS[7]}) do
  local err = baton_error(baton)
  if err then
    return err
  end
end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
expire_with(KEYS[2], KEYS[3], now)
local left = redis.call('ZCARD', KEYS[2])
if left == 0 and redis.call('ZCARD', KEYS[4]) > 0 and not up[1]
    and redis.call('EXISTS', KEYS[1]) == 0 then
  push_baton(KEYS[5], ARGV[5])
end
if up[2] and tonumber(up[2]) > now
    and (left == 0 or (left == 1 and redis.call('ZSCORE', KEYS[2], up[1]))) then
  push_baton(KEYS[7], ARGV[5])
end
return 0

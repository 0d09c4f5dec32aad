-- release_read: release one read guard; the last one ends the hold, and
-- the last reader wakes a waiting writer.
--
-- KEYS[1]  write key       (hash: flag, ...; only its existence is read)
-- KEYS[2]  readers key     (sorted set: identity -> lease end, server ms)
-- KEYS[3]  depths key      (hash: identity -> "<depth>:<token>")
-- KEYS[4]  writers key     (sorted set: waiting writer -> place end)
-- KEYS[5]  write baton key (list)
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
--                and no writer holds, a write baton was pushed
--
-- now_ms, purge, expire_with, read_hold, ms_score (lib/rw.lua),
-- baton_error and push_baton (lib/baton.lua) are prepended.
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

local err = baton_error(KEYS[5])
if err then
  return err
end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
expire_with(KEYS[2], KEYS[3], now)
if redis.call('ZCARD', KEYS[2]) == 0 and redis.call('ZCARD', KEYS[4]) > 0
    and redis.call('EXISTS', KEYS[1]) == 0 then
  push_baton(KEYS[5], ARGV[5])
end
return 0

-- undo: free what a request whose reply was lost may have taken (a read,
-- upgradable or write acquisition, or an upgrade, that timed out), so
-- that it does not block others until its lease ends. Sent by the client's background thread once Redis
-- answers again; safe to send any number of times.
--
-- KEYS[1]  write key       (hash: flag, req, rwait, uwait, ...)
-- KEYS[2]  readers key     (sorted set)
-- KEYS[3]  depths key      (hash: identity -> "<depth>:<token>")
-- KEYS[4]  writers key     (sorted set)
-- KEYS[5]  read baton key  (list)
-- KEYS[6]  write baton key (list)
-- KEYS[7]  upgradable key  (hash: flag, req, upgrading, rwait, uwait, ...)
-- KEYS[8]  upgradable baton key (list)
-- KEYS[9]  upgrade baton key (list)
-- ARGV[1]  identity the request was made for
-- ARGV[2]  the request's number (a fresh read hold's token; `req` of a
--          write or upgradable hold)
-- ARGV[3]  baton TTL in milliseconds
--
-- Returns 1 when a hold of that request was found and freed (waiters
-- woken as by a release), 0 otherwise.
-- now_ms, purge, expire_with, read_hold (lib/rw.lua), baton_error and
-- push_baton (lib/baton.lua) are prepended.
local up = redis.call('HMGET', KEYS[7], 'flag', 'req', 'upgrading', 'rwait', 'uwait')
for _, baton in ipairs({KEYS[5], KEYS[6], KEYS[8], KEYS[9]}) do
  local err = baton_error(baton)
  if err then
    return err
  end
end
local now = now_ms()
purge(KEYS[2], KEYS[3], KEYS[4], now)
local id = ARGV[1]
local freed = 0
local held = redis.call('HMGET', KEYS[1], 'flag', 'req', 'uwait')
if held[1] == id and held[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  push_baton(KEYS[5], ARGV[3])
  if held[3] then
    push_baton(KEYS[8], ARGV[3])
  end
  freed = 1
end
if up[1] == id and up[2] == ARGV[2] then
  redis.call('DEL', KEYS[7])
  if up[4] then
    push_baton(KEYS[5], ARGV[3])
  end
  if up[5] then
    push_baton(KEYS[8], ARGV[3])
  end
  up = {false, false, false, false, false}
  freed = 1
end
local _, token = read_hold(KEYS[3], id)
if token == ARGV[2] then
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  expire_with(KEYS[2], KEYS[3], now)
  freed = 1
end
if freed == 1 then
  local left = redis.call('ZCARD', KEYS[2])
  if left == 0 and redis.call('ZCARD', KEYS[4]) > 0 and not up[1]
      and redis.call('EXISTS', KEYS[1]) == 0 then
    push_baton(KEYS[6], ARGV[3])
  end
  if up[3] and tonumber(up[3]) > now
      and (left == 0 or (left == 1 and redis.call('ZSCORE', KEYS[2], up[1]))) then
    push_baton(KEYS[9], ARGV[3])
  end
end
return freed

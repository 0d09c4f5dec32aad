-- upgrade: the upgradable reader takes the write hold once no other reader
-- holds, or marks that it waits (holding fresh readers back) and reports
-- how long until it is worth looking again. Its upgradable hold stays: no
-- writer and no other upgradable reader can get in meanwhile, and once the
-- write hold ends it still holds the upgradable read.
--
-- KEYS[1]  upgradable key (hash: flag, count, fence = token, req,
--                          upgrading, rwait, uwait)
-- KEYS[2]  write key      (hash: flag, count, fence, req, rwait, uwait)
-- KEYS[3]  readers key    (sorted set: identity -> lease end, server ms)
-- KEYS[4]  depths key     (hash: identity -> "<depth>:<token>")
-- KEYS[5]  writers key    (sorted set: waiting writer -> place end, server ms)
-- KEYS[6]  fence key      (string: the fencing counter of write holds)
-- ARGV[1]  identity of the caller
-- ARGV[2]  token of the caller's upgradable hold
-- ARGV[3]  lease of the write hold in milliseconds
-- ARGV[4]  TTL of the fence counter in milliseconds
-- ARGV[5]  this request's number (see undo.lua)
-- ARGV[6]  when refused, mark the upgrade as waiting for this many
--          milliseconds (from the server's clock): fresh readers are
--          refused while the mark lives; "0": no mark (the caller will not
--          wait)
-- ARGV[7]  token of the caller's live read guards, or "0": its own read
--          hold does not keep it from writing
--
-- Returns {1, fence, 1}  the write hold, under a fresh fencing token, or
--                        this request's own hold when it is sent again
--         {0, wait_ms}   refused: other readers hold; wait_ms until the
--                        last of their leases ends
--         {-3}           the caller does not hold the upgradable read (its
--                        lease ran out); nothing was changed
--
-- Waiting writers are not in the way: they wait for the upgradable hold
-- too. Errors come before any write: HMGET fails with WRONGTYPE when the
-- upgradable or write key is not a hash, purge when the readers key is not
-- a sorted set. now_ms, purge, read_hold, ms_score (lib/rw.lua) and
-- next_fence (lib/next_fence.lua) are prepended.
local up = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'upgrading', 'rwait')
local held = redis.call('HMGET', KEYS[2], 'flag', 'fence', 'req', 'count')
local now = now_ms()
purge(KEYS[3], KEYS[4], KEYS[5], now)
local id = ARGV[1]

-- The same request sent again (its first reply was lost): the hold its
-- first run made, rather than a second one under a new fencing token.
if held[1] == id and held[3] == ARGV[5] then
  return {1, tonumber(held[2]), tonumber(held[4])}
end
if up[1] ~= id or up[2] ~= ARGV[2] then
  return {-3}
end
if held[1] and held[1] ~= id then
  -- Cannot be while the upgradable hold lives (no writer gets in beside
  -- it); answered as a refusal all the same.
  return {0, redis.call('PTTL', KEYS[2])}
end

-- The caller's own read hold is not in the way.
local others = redis.call('ZCARD', KEYS[3])
local _, token = read_hold(KEYS[4], id)
if token then
  others = others - 1
end

if others == 0 then
  -- fence_text: the token's digits as next_fence stored them (formatting
  -- the number again would cost more than a Redis call).
  local fence, err, fence_text = next_fence(KEYS[6], ARGV[4])
  if err then
    return err
  end
  if token and token ~= ARGV[7] then
    -- A leftover read hold of this identity (its guards are gone).
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
  end
  -- Readers refused by the mark wait for this write hold's release.
  redis.call('HSET', KEYS[2], 'flag', id, 'count', 1, 'fence', fence_text, 'req', ARGV[5])
  if up[4] then
    redis.call('HSET', KEYS[2], 'rwait', 1)
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('HDEL', KEYS[1], 'upgrading', 'rwait')
  return {1, fence, 1}
end

if ARGV[6] ~= '0' then
  redis.call('HSET', KEYS[1], 'upgrading', ms_score(now, ARGV[6]))
end
-- The latest lease among the other readers.
local last = redis.call('ZRANGE', KEYS[3], -2, -1, 'WITHSCORES')
local wait = 0
for i = 1, #last, 2 do
  if last[i] ~= id then
    wait = math.max(wait, tonumber(last[i + 1]) - now)
  end
end
return {0, wait}

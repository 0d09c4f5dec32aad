-- read: take a read hold, re-enter one this thread holds, or report how
-- long until it is worth looking again.
--
-- KEYS[1]  write key      (hash: flag, count, fence, req, rwait)
-- KEYS[2]  readers key    (sorted set: identity -> lease end, server ms)
-- KEYS[3]  depths key     (hash: identity -> "<depth>:<token>")
-- KEYS[4]  writers key    (sorted set: waiting writer -> place end, server ms)
-- KEYS[5]  read baton key (list holding at most one "ok" token)
-- KEYS[6]  upgradable key (hash: flag = the upgradable reader, upgrading =
--                          end of its waiting upgrade's mark, server ms)
-- ARGV[1]  identity of the caller
-- ARGV[2]  lease in milliseconds: of this hold when fresh, of the hold the
--          caller's live guards belong to when re-entering
-- ARGV[3]  token of the hold the caller's live read guards belong to, or
--          "0" when it has none
-- ARGV[4]  the caller's depth after this acquisition (its live guards + 1)
-- ARGV[5]  this request's number: the token of a fresh hold (and what
--          undo.lua matches when the reply is lost)
-- ARGV[6]  "1" when the caller has been waiting: it passes a read baton on,
--          so that a parked reader of another process wakes in turn; "-1"
--          when it will not wait if refused (a try_read): its refusal
--          marks no `rwait`, for no read baton need wake it; else "0"
-- ARGV[7]  baton TTL in milliseconds
-- ARGV[8]  "1" from a waiter whose park ended when the read baton list
--          changed, with no look that popped its token (the parking hub
--          rings such a waiter at the list's announcement): the token is
--          popped first, whatever comes of the attempt, as the look would
--          have popped it for this waiter; else "0"
-- KEYS[7]  with ARGV[9]: the read grant specs (hash: identity ->
--          "<request> <grant lease ms>")
-- ARGV[9]  from a waiter that parks where a release may grant it the read
--          (see release_write.lua): the grant's lease in ms; else absent
-- ARGV[10] with ARGV[9]: how long its spec lives, in ms
--
-- Returns {1, token, depth}  acquired: fresh (depth 1) or re-entered, or
--                            this request's own hold when it is sent again
--         {0, wait_ms}       refused: a writer holds the lock (wait_ms = its
--                            remaining lease, -1 when it has none), or a
--                            writer waits (wait_ms = until the earliest
--                            waiting writer's place ends), or the
--                            upgradable reader waits to upgrade (wait_ms =
--                            until its mark ends)
--         {0, wait_ms, 1}    refused by a holding writer, a grant spec
--                            left (with ARGV[9])
--
-- Writer preference: while a writer or an upgrade waits, a fresh reader is
-- refused; a reader re-entering its own hold, the writer itself (which may
-- take read: downgrade) and the upgradable reader are not. A refusal by a
-- holding writer sets `rwait` on the write key, one by an upgrade's mark
-- `rwait` on the upgradable key, so that their end pushes a read baton.
-- A refusal by a holding writer that leaves a grant spec (ARGV[9]) sets
-- `rwait` only: a writer's last release grants the read to the spec's
-- waiter (release_write.lua) and pushes a read baton only for refusals
-- that left none (`rplain`, the waiters a grant cannot reach) or a grant
-- nobody heard. Every hold this script takes or finds its request's takes
-- the caller's spec off: a grant never lands on a live hold.
-- now_ms, purge, first_place, expire_with, read_hold, ms_score
-- (lib/rw.lua), baton_error and push_baton (lib/baton.lua) are prepended.
if ARGV[8] == '1' then
  redis.call('LPOP', KEYS[5])
end
local writer = redis.call('HMGET', KEYS[1], 'flag')[1]
local up = redis.call('HMGET', KEYS[6], 'flag', 'upgrading')
local now = now_ms()
purge(KEYS[2], KEYS[3], nil, now)
local id = ARGV[1]
local _, token = read_hold(KEYS[3], id)

if token and token == ARGV[3] then
  redis.call('HSET', KEYS[3], id, ARGV[4] .. ':' .. token)
  redis.call('ZADD', KEYS[2], 'GT', ms_score(now, ARGV[2]), id)
  expire_with(KEYS[2], KEYS[3], now)
  return {1, tonumber(token), tonumber(ARGV[4])}
end

-- The same request sent again (the transport resends a script whose reply
-- was lost): its first run made this hold, whatever came in between (a
-- writer that queued since would refuse a fresh reader, and the hold
-- would be nobody's until its lease ends). Answer as the first run did.
if token and token == ARGV[5] then
  -- Perhaps a release's grant of this very request: its end moves on,
  -- so that a give-back of the grant (which names the end it wrote, see
  -- release_read.lua) leaves the hold its waiter now holds.
  local ends = tonumber(redis.call('ZSCORE', KEYS[2], id)) or 0
  redis.call('ZADD', KEYS[2], math.max(tonumber(ms_score(now, ARGV[2])), ends + 1), id)
  expire_with(KEYS[2], KEYS[3], now)
  if KEYS[7] then
    redis.call('HDEL', KEYS[7], id)
  end
  return {1, tonumber(token), 1}
end

if writer and writer ~= id then
  if ARGV[9] and KEYS[7] then
    redis.call('HSET', KEYS[7], id, ARGV[5] .. ' ' .. ARGV[9])
    if redis.call('PTTL', KEYS[7]) < tonumber(ARGV[10]) then
      redis.call('PEXPIRE', KEYS[7], ARGV[10])
    end
    redis.call('HSET', KEYS[1], 'rwait', 1)
    return {0, redis.call('PTTL', KEYS[1]), 1}
  end
  if ARGV[6] ~= '-1' then
    redis.call('HSET', KEYS[1], 'rwait', 1, 'rplain', 1)
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if not writer and up[1] ~= id then
  local first = first_place(KEYS[4], now)
  if #first > 0 then
    return {0, math.max(tonumber(first[2]) - now, 0)}
  end
  if up[2] and tonumber(up[2]) > now then
    if ARGV[6] ~= '-1' then
      redis.call('HSET', KEYS[6], 'rwait', 1)
    end
    return {0, tonumber(up[2]) - now}
  end
end

if ARGV[6] == '1' then
  local err = baton_error(KEYS[5])
  if err then
    return err
  end
end
-- A hold of this identity under another token is a leftover (its guards
-- are gone): replaced by the fresh one.
redis.call('ZADD', KEYS[2], ms_score(now, ARGV[2]), id)
redis.call('HSET', KEYS[3], id, '1:' .. ARGV[5])
expire_with(KEYS[2], KEYS[3], now)
if KEYS[7] then
  redis.call('HDEL', KEYS[7], id)
end
if ARGV[6] == '1' then
  push_baton(KEYS[5], ARGV[7])
end
return {1, tonumber(ARGV[5]), 1}

-- release: return the permits of one permit id.
--
-- KEYS[1..6]  state, holders, counts, waiters, baton, reserved baton (see
--             lib/permits.lua)
-- KEYS[7]     with ARGV[3]: the grant specs (see lib/permits.lua)
-- ARGV[1]     the permit id
-- ARGV[2]     baton TTL in milliseconds
-- ARGV[3]     where the deployment allows grants (one server, Sentinel's
--             master without replica acknowledgements): the prefix of the
--             clients' grant channels; else absent
-- ARGV[4]     with ARGV[3], from a client that gives back permits granted
--             to a waiter it did not find parked: the end of their lease
--             the grant wrote (server ms), or "" for any other release.
--             The permits are released only while their lease still ends
--             then: the waiter may have taken them itself since (an
--             attempt sent again after its reply was lost finds its own
--             request's permits held, and takes them, see acquire.lua,
--             which moves their end on), and they are no longer the
--             grant's to give back.
--
-- The grant: each waiter the freed permits may serve (see wake in
-- lib/permits.lua) whose last attempt left a spec is granted its permits,
-- when its client hears the message (lib/grant_message.lua; nobody heard
-- it, or the channel is refused: a token, as before): the permit id
-- `<identity>:<request>` holds them for the grant's lease, and the
-- waiter's place and spec go. The message's token is 0 (permits have no
-- fencing token), and its `<behind>` is the end of the permits' lease
-- (server ms), which a give-back names (ARGV[4]). A grant its
-- client gives back (the waiter was not parked for it: it stopped
-- waiting, or is on its way to its next attempt, which puts its place
-- back) is a release like any other.
--
-- Returns {1, k}       released k permits, and granted them or pushed a
--                      token for each waiter they may serve (up to the live
--                      waiters)
--         {0}          the id holds nothing: its lease had ended (its permits
--                      returned then, counted once), or it never held any
--         {-1}         no total is set (the state was deleted); the id is
--                      forgotten
--         {-3, field}  the state is damaged (1: total, 2: used)
--
-- Safe to send twice: the second finds nothing ({0}).
local id = ARGV[1]
local now = server_ms()
-- Every key is read before the first write (sem_look), so that a key of
-- another type fails the call with nothing changed.
local look, err = sem_look(id, now)
if not look then
  return err
end
local st, reply = read_state(look.stored)
if not st then
  if reply[1] == -1 then
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
  end
  return reply
end
purge(st, now, look.expired)
if (ARGV[4] or '') ~= '' and tonumber(redis.call('ZSCORE', KEYS[2], id)) ~= tonumber(ARGV[4]) then
  -- A give-back of permits their waiter took since, or that ended.
  save(st)
  return {0}
end
-- Gone from the holders (its lease ended, here or before): it holds
-- nothing. Else its count, read before purge, is still its own (purge
-- removed only holders it also took off the holders set).
if redis.call('ZREM', KEYS[2], id) == 0 then
  save(st)
  return {0}
end
local k = tonumber(look.held)
redis.call('HDEL', KEYS[3], id)
st.used = math.max(0, st.used - (k or 0))
st.passes = 0
local grant = nil
if ARGV[3] then
  grant = function(member, wanted)
    local spec = redis.call('HGET', KEYS[7], member)
    local req, lease, on = string.match(spec or '', '^(%d+) ([1-9]%d*) ([br])$')
    local identity = string.match(member, '^%d+:(.+)$')
    if not (req and identity) then
      return false
    end
    local list = KEYS[5]
    if on == 'r' then
      list = KEYS[6]
    end
    local ends = int(now + tonumber(lease))
    if not publish_grant(ARGV[3], identity, req, 0, ends, KEYS[1], list) then
      return false
    end
    local granted = identity .. ':' .. req
    redis.call('ZADD', KEYS[2], ends, granted)
    redis.call('HSET', KEYS[3], granted, int(wanted))
    st.used = st.used + wanted
    redis.call('ZREM', KEYS[4], member)
    redis.call('HDEL', KEYS[7], member)
    return true
  end
end
wake(st, now, ARGV[2], false, look.waiters, look.tokens, look.reserved_tokens, grant)
save(st)
return {1, k or 0}

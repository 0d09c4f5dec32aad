-- release: return the permits of one permit id.
--
-- KEYS[1..6]  state, holders, counts, waiters, baton, reserved baton (see
--             lib/permits.lua)
-- ARGV[1]     the permit id
-- ARGV[2]     baton TTL in milliseconds
--
-- Returns {1, k}       released k permits, and pushed a token for each waiter
--                      they may serve (up to the live waiters)
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
wake(st, now, ARGV[2], false, look.waiters, look.tokens, look.reserved_tokens)
save(st)
return {1, k or 0}

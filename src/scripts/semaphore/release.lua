-- release: return the permits of one permit id.
--
-- KEYS[1..5]  state, holders, counts, waiters, baton (see lib/permits.lua)
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
local err = sem_type_error()
if err then
  return err
end
local id = ARGV[1]
local st, reply = read_state()
if not st then
  if reply[1] == -1 then
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
  end
  return reply
end
local now = server_ms()
purge(st, now)
local k = tonumber(redis.call('HGET', KEYS[3], id))
if not redis.call('ZSCORE', KEYS[2], id) then
  save(st)
  return {0}
end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
st.used = math.max(0, st.used - (k or 0))
st.passes = 0
wake(st, now, ARGV[2], false)
save(st)
return {1, k or 0}

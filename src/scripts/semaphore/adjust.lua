-- adjust: add permits to the total, or take them off it.
--
-- KEYS[1..6]  state, holders, counts, waiters, baton, reserved baton (see
--             lib/permits.lua)
-- KEYS[7]     adjusted (sorted set: the ids of recent adjustments -> when
--             each is forgotten, server ms; TTL: the longest of them)
-- ARGV[1]     "add" or "reduce"
-- ARGV[2]     how many (1 to 10^12)
-- ARGV[3]     this request's id, unique per call of the client: a request
--             sent again (its first reply lost on a dropped connection) is
--             applied once, whatever other adjustments ran in between
-- ARGV[4]     baton TTL in milliseconds
-- ARGV[5]     how long an applied id is remembered, in milliseconds
--
-- Returns {1, total}   the new total
--         {-1}         no total was ever set
--         {-2, total}  adding would take the total past 10^12; unchanged
--         {-3, field}  the state is damaged (field 1: total, 2: used)
--
-- A reduction never takes the total below zero. Below what is held, no
-- permit is available until enough holders release (or their leases end);
-- held permits are never taken back. An addition wakes the waiters it can
-- serve; a reduction wakes the waiters whose k it put over the total, whose
-- next attempt reports it.
local err = sem_type_error()
if err then
  return err
end
local st, reply = read_state()
if not st then
  return reply
end
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
if redis.call('ZSCORE', KEYS[7], ARGV[3]) then
  return {1, st.total}
end
local n = tonumber(ARGV[2])
if ARGV[1] == 'add' then
  if st.total + n > 1e12 then
    return {-2, st.total}
  end
  st.total = st.total + n
else
  st.total = math.max(0, st.total - n)
end
purge(st, now)
st.passes = 0
wake(st, now, ARGV[4], false)
save(st)
-- The field the previous version kept (one id only).
redis.call('HDEL', KEYS[1], 'adjusted')
local remembered = tonumber(ARGV[5])
redis.call('ZADD', KEYS[7], int(now + remembered), ARGV[3])
if redis.call('PTTL', KEYS[7]) < remembered then
  redis.call('PEXPIRE', KEYS[7], remembered)
end
return {1, st.total}

-- adjust: add permits to the total, or take them off it.
--
-- KEYS[1..5]  state, holders, counts, waiters, baton (see lib/permits.lua)
-- ARGV[1]     "add" or "reduce"
-- ARGV[2]     how many (1 to 10^12)
-- ARGV[3]     this request's id, unique per client: a request sent again
--             (its first reply lost on a dropped connection) is applied once
-- ARGV[4]     baton TTL in milliseconds
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
if redis.call('HGET', KEYS[1], 'adjusted') == ARGV[3] then
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
local now = server_ms()
purge(st, now)
st.passes = 0
wake(st, now, ARGV[4], false)
save(st)
redis.call('HSET', KEYS[1], 'adjusted', ARGV[3])
return {1, st.total}

-- state: the total and the permits available now, after returning the
-- permits of holders whose lease ended (the one write; it wakes the waiters
-- those permits may serve).
--
-- KEYS[1..5]  state, holders, counts, waiters, baton (see lib/permits.lua)
-- ARGV[1]     baton TTL in milliseconds
--
-- Returns {1, total, available}
--         {-1}         no total was ever set
--         {-3, field}  the state is damaged (1: total, 2: used)
local err = sem_type_error()
if err then
  return err
end
local st, reply = read_state()
if not st then
  return reply
end
local now = server_ms()
if purge(st, now) > 0 then
  st.passes = 0
  wake(st, now, ARGV[1], false)
  save(st)
end
return {1, st.total, math.max(0, st.total - st.used)}

-- state: the total and the permits available now, after returning the
-- permits of holders whose lease ended and dropping a reservation whose
-- waiter has gone (the only writes; they wake the waiters those permits may
-- serve). A waiter that reserved and gives up calls it after leaving.
--
-- KEYS[1..6]  state, holders, counts, waiters, baton, reserved baton (see
--             lib/permits.lua)
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
-- A reservation given up (its waiter left) frees the permits it held back:
-- the waiters it held back are woken for them.
local had = st.reserved
reservation(st, now)
if purge(st, now) > 0 or had ~= st.reserved then
  st.passes = 0
  wake(st, now, ARGV[1], false)
  save(st)
end
return {1, st.total, math.max(0, st.total - st.used)}

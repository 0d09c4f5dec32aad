-- set: give the semaphore its total of permits, unless it has one already
-- (the first writer wins).
--
-- KEYS[1..6]  state, holders, counts, waiters, baton, reserved baton (see
--             lib/permits.lua)
-- ARGV[1]     the total (1 to 10^12)
-- ARGV[2]     baton TTL in milliseconds
--
-- Returns {1, total}   written
--         {0, total}   a total was in force already (that one), unchanged
--         {-3, field}  the state is damaged (field 1: total, 2: used)
--
-- A fresh state counts as used what live holders hold, so that a state
-- deleted by hand while permits were held does not hand them out twice.
-- sem_type_error, read_state, server_ms, purge, wake and save come from
-- lib/permits.lua.
local err = sem_type_error()
if err then
  return err
end
local st, reply = read_state()
if st then
  return {0, st.total}
end
if reply[1] ~= -1 then
  return reply
end
local now = server_ms()
st = {total = tonumber(ARGV[1]), used = 0, passes = 0}
purge(st, now)
for _, k in ipairs(redis.call('HVALS', KEYS[3])) do
  st.used = st.used + (tonumber(k) or 0)
end
wake(st, now, ARGV[2], false)
save(st)
return {1, st.total}

-- renew: make a live permit's lease last at least `lease` more; the
-- watchdog's renewal. Never brings back a permit whose lease has ended (its
-- permits have returned, or will at the next script), never shortens one.
--
-- KEYS[1]  holders (sorted set: permit id -> end of its lease, server ms)
-- ARGV[1]  the permit id
-- ARGV[2]  the lease in milliseconds
--
-- Returns 1 when renewed (or already living longer), 0 when the id holds
-- nothing or its lease has ended. server_ms and int come from
-- lib/permits.lua.
local now = server_ms()
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', 'GT', int(now + tonumber(ARGV[2])), ARGV[1])
return 1

-- renew_read: make a read hold live at least a lease more, only for its
-- owner (identity and token). Used by the watchdog. Never re-creates a
-- hold that is gone, never shortens one (ZADD GT).
--
-- KEYS[1]  readers key  (sorted set: identity -> lease end, server ms)
-- KEYS[2]  depths key   (hash: identity -> "<depth>:<token>")
-- ARGV[1]  identity of the reader
-- ARGV[2]  token of its hold
-- ARGV[3]  lease in milliseconds
--
-- Returns 1 when renewed (or already living longer), 0 when the hold is
-- not there any more (its lease ended, or a new hold replaced it).
-- now_ms, expire_with, read_hold, ms_score (lib/rw.lua) are prepended.
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
local _, token = read_hold(KEYS[2], ARGV[1])
if token ~= ARGV[2] then
  return 0
end
redis.call('ZADD', KEYS[1], 'GT', ms_score(now, ARGV[3]), ARGV[1])
expire_with(KEYS[1], KEYS[2], now)
return 1

-- renew: make the lock live at least a lease more, only for its current
-- owner. Used by the watchdog and by guard.extend(). Never re-creates a lock
-- that is gone, and never shortens a lease (extend_lease, from lib/).
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- ARGV[1]  identity of the caller
-- ARGV[2]  fencing token of the caller's ownership
-- ARGV[3]  lease in milliseconds
--
-- Returns 1 when renewed (or already living longer), 0 when the lock is not
-- this ownership's (gone, or held by another identity, or taken again since
-- with a new token).
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
extend_lease(KEYS[1], ARGV[3])
return 1

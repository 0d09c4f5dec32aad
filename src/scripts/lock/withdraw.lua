-- withdraw: a plain lock's waiter that stops waiting without the lock
-- takes its grant off the ownership it last found in its way, if it is
-- still the waiter marked there: that ownership's release then opens its
-- window (or pushes the baton) as for a waiter that cannot be granted,
-- instead of granting the lock to a waiter that is gone and having it
-- given back (lib/grant.lua). A release that came first granted it
-- already; the waiter's client gives that back.
--
-- KEYS[1]  lock key
-- ARGV[1]  identity of the waiter
--
-- Returns 1 when the grant was taken off, else 0.
local queued = redis.call('HMGET', KEYS[1], 'queued')[1]
if queued == ARGV[1] then
  return redis.call('HDEL', KEYS[1], 'grant')
end
return 0

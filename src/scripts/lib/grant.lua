-- The grant: a release that frees a lock whose `queued` waiter (the one
-- its window would be kept for, see lib/hand_over.lua) parks where a grant
-- reaches it writes that waiter's ownership itself, and tells the waiter's
-- client on its grant channel (the parking hub's listener is subscribed
-- to it). The waiter wakes holding the lock, with no attempt of its own:
-- a hand-off between processes is the release, the message and a thread's
-- wake-up, where it was the release, an announcement, a wake-up and an
-- attempt.
--
-- What the mark keeps (`grant`, written by the waiter's attempts, see
-- mark_in_the_way): the request its park follows, the grant's lease and
-- the waiter's reserve. The grant's lease is short (its client's
-- watchdog lengthens it to the waiter's own at once): a waiter that
-- stopped waiting just before the grant came, in a process that ended
-- before it could give the grant back, costs the others that much, not a
-- whole lease. The message: `<waiter> <request> <token> <length of the lock
-- key> <lock key><baton key>`. Its client matches waiter and request
-- against the threads parked there now: a message of an older park (or
-- for a thread that has stopped waiting) finds nobody, and the client
-- gives the ownership back with a release; a thread whose park ended
-- before the message came takes the ownership as a leftover of its own
-- identity at its next attempt (lock/acquire.lua), under a new token.
--
-- Nobody heard it (`PUBLISH` answers 0: the waiter's client is gone, or
-- its hub is not subscribed now), the channel is refused (an ACL without
-- `PUBLISH` or the channel: `pcall`), or the fence counter is damaged:
-- no grant, and the release opens the window as before.

-- grant(key, baton, fence_key, fence_ttl, channels, waiter, spec): grants
-- the lock at `key` (deleted by the caller) to `waiter`, whose mark is
-- `spec`, by a message on `channels` .. its client's id; whether it did.
local function grant(key, baton, fence_key, fence_ttl, channels, waiter, spec)
  local req, lease, reserve = string.match(spec, '^(%d+) ([1-9]%d*) (%d+)$')
  if not req then
    return false
  end
  local _, err, token = next_fence(fence_key, fence_ttl, nil, reserve)
  if err then
    return false
  end
  local client = string.match(waiter, '^[^:]*')
  local message = waiter .. ' ' .. req .. ' ' .. token .. ' ' .. #key .. ' ' .. key .. baton
  local heard = redis.pcall('PUBLISH', channels .. client, message)
  if type(heard) ~= 'number' or heard == 0 then
    return false
  end
  redis.call('HSET', key, 'flag', waiter, 'count', '1', 'fence', token, 'req', 'grant', 'waited', '1')
  redis.call('PEXPIRE', key, lease)
  return true
end

-- The grant: a release that frees a lock for a waiter of another process
-- (the plain lock's `queued` waiter, the one its window would be kept
-- for, see lib/hand_over.lua; the head of a fair lock's queue) parked
-- where a grant reaches it writes that waiter's ownership itself, and tells the waiter's
-- client on its grant channel (the parking hub's listener is subscribed
-- to it). The waiter wakes holding the lock, with no attempt of its own:
-- a hand-off between processes is the release, the message and a thread's
-- wake-up, where it was the release, an announcement, a wake-up and an
-- attempt.
--
-- What the waiter's attempts keep for it (its *spec*, `<request> <lease>
-- <reserve>`: the plain lock's on its mark, `grant`, see mark_in_the_way;
-- the fair lock's in a key of the waiter's own, see fair/acquire.lua): the
-- request its park follows, the grant's lease and the tokens it sets aside.
-- The grant's lease is short (its client's
-- watchdog lengthens it to the waiter's own at once): a waiter that
-- stopped waiting just before the grant came, in a process that ended
-- before it could give the grant back, costs the others that much, not a
-- whole lease. The message: `<waiter> <request> <token> <behind> <length
-- of the lock key> <lock key><list>`, where `<behind>` is the fair lock's
-- line passed with the grant (`<waiter>,<arrival>,...;<next>`, see
-- fair/release.lua; the plain lock's is `;`), and `<list>` the list the
-- waiter parks on. Its client matches waiter and request
-- against the threads parked there now: a message of an older park (or
-- for a thread that has stopped waiting) finds nobody, and the client
-- gives the ownership back with a release; a thread whose park ended
-- before the message came takes the ownership as a leftover of its own
-- identity at its next attempt (lock/acquire.lua), under a new token.
--
-- The semaphore's grants (lib/permits.lua) send the same message
-- (publish_grant, lib/grant_message.lua).
--
-- Nobody heard it (`PUBLISH` answers 0: the waiter's client is gone, or
-- its hub is not subscribed now), the channel is refused (an ACL without
-- `PUBLISH` or the channel: `pcall`), or the fence counter is damaged:
-- no grant, and the release wakes the waiter as before.

-- grant_spec(spec): the request, lease and reserve a waiter's spec names,
-- or nil for one that is not a spec.
local function grant_spec(spec)
  return string.match(spec, '^(%d+) ([1-9]%d*) (%d+)$')
end

-- grant(key, list, fence_key, fence_ttl, channels, waiter, req, lease,
-- reserve, behind): grants the lock at `key` (deleted by the caller) to
-- `waiter`, parked on `list` after request `req`, for `lease` ms, setting
-- aside `reserve` tokens, by a message on `channels` .. its client's id
-- that tells `behind`; whether it did.
local function grant(key, list, fence_key, fence_ttl, channels, waiter, req, lease, reserve, behind)
  local _, err, token = next_fence(fence_key, fence_ttl, nil, reserve)
  if err then
    return false
  end
  if not publish_grant(channels, waiter, req, token, behind, key, list) then
    return false
  end
  redis.call('HSET', key, 'flag', waiter, 'count', '1', 'fence', token, 'req', 'grant', 'waited', '1')
  redis.call('PEXPIRE', key, lease)
  return true
end

-- The read-write lock's write grant: a release that frees the lock for a
-- waiting writer (a writer's last release, the last reader's release, the
-- upgradable reader's last release) writes the write hold for the first
-- waiting writer itself, when that writer left a grant spec (write.lua:
-- it parks where a grant reaches it), and tells its client on its grant
-- channel, as the lock's grant does (lib/grant.lua). The writer wakes
-- holding the lock, with no attempt of its own. Without a spec, or when
-- nobody hears the message, the caller pushes the write baton as before.
--
-- The first waiting writer is the one whose place ends first: the one
-- whose last attempt is the oldest (every place lasts as long, from each
-- attempt). A writer without a spec there (a fixed lease longer than a
-- grant's, a client whose grants do not reach it) is woken by the baton,
-- and no writer behind it is granted over it.
--
-- The message's `<behind>` is `w`, which tells its client's give-back
-- that a write hold was granted (a read grant passes its lease end).

-- first_writer(writers, now): the first live waiting writer of `writers`
-- (the one whose place ends first), or nil, read without writing.
local function first_writer(writers, now)
  return redis.call('ZRANGEBYSCORE', writers, '(' .. string.format('%d', now), '+inf', 'LIMIT',
    '0', '1')[1]
end

-- grant_writer(waiter, writers, specs, write, fence, fence_ttl, channels,
-- list, now): grants the write hold at `write` (free: the caller deleted
-- it, or checked it is absent, and no reader or upgradable reader holds)
-- to `waiter`, the first live waiting writer of `writers` (first_writer;
-- nil: none, no grant), by its spec in `specs`, with a token of `fence`
-- (`fence_ttl` ms), by a message on `channels` .. its client's id that
-- names `list`; whether it did. The spec goes either way.
local function grant_writer(waiter, writers, specs, write, fence, fence_ttl, channels, list, now)
  if not waiter then
    return false
  end
  local spec = redis.call('HGET', specs, waiter)
  if not spec then
    return false
  end
  redis.call('HDEL', specs, waiter)
  local req, lease = string.match(spec, '^(%d+) ([1-9]%d*)$')
  if not req then
    return false
  end
  local _, err, token = next_fence(fence, fence_ttl)
  if err then
    return false
  end
  if not publish_grant(channels, waiter, req, token, 'w', write, list) then
    return false
  end
  -- As write.lua writes the hold of a writer that kept a place: readers
  -- and upgradable readers may have been refused on its account.
  redis.call('HSET', write, 'flag', waiter, 'count', '1', 'fence', token, 'req', 'grant', 'rwait',
    '1', 'uwait', '1')
  redis.call('PEXPIRE', write, lease)
  redis.call('ZREM', writers, waiter)
  expire_with(writers, nil, now)
  return true
end

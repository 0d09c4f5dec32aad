-- The message of a grant (see lib/grant.lua for the lock's, lib/permits.lua
-- for the semaphore's), on the channel of the waiter's client.

-- publish_grant(channels, waiter, req, token, behind, key, list): tells the
-- client of `waiter` (the part of its identity before the first `:`), on
-- `channels` .. that client's id, that what `key` holds was granted to
-- `waiter`, parked on `list` after request `req`, under `token`, with
-- `behind` passed along; whether its client heard it (a refused channel,
-- an ACL without PUBLISH, is not heard: `pcall`).
local function publish_grant(channels, waiter, req, token, behind, key, list)
  local client = string.match(waiter, '^[^:]*')
  local message = waiter .. ' ' .. req .. ' ' .. token .. ' ' .. behind .. ' ' .. #key .. ' ' .. key .. list
  local heard = redis.pcall('PUBLISH', channels .. client, message)
  return type(heard) == 'number' and heard > 0
end

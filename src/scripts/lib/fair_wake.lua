-- baton_error(key) and push_baton(key, ttl) for the fair lock, in place of
-- lib/baton.lua: the shared release scripts (release.lua,
-- release_request.lua, force_unlock.lua) then wake the head of the fair
-- lock's queue on its own list, instead of any waiter on a shared one.
-- `key` is the prefix of the waiters' lists (`<prefix>:<identity>`); the
-- queue lives next to KEYS[1], the lock key. fair_queue.lua comes first.
local function baton_error(key)
  return queue_error(KEYS[1])
end

local function push_baton(key, ttl)
  wake_head(KEYS[1], key, ttl)
end

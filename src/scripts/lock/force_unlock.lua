-- force_unlock: administrative release, whoever holds the lock and at any
-- depth. Wakes one waiter like a normal last release.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req)
-- KEYS[2]  baton key  (list holding at most one "ok" token)
-- ARGV[1]  baton TTL in milliseconds
--
-- Returns 1 when a lock was removed, 0 when the lock was already free.
-- baton_error and push_baton come from lib/.
local lock_type = redis.call('TYPE', KEYS[1])['ok']
if lock_type == 'none' then
  return 0
end
if lock_type ~= 'hash' then
  return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' holds a ' .. lock_type .. ', not a hash')
end
-- A lock in its hand-over window (lib/hand_over.lua) is held by nobody.
if redis.call('HEXISTS', KEYS[1], 'flag') == 0 then
  return 0
end
local err = baton_error(KEYS[2])
if err then
  return err
end
redis.call('DEL', KEYS[1])
push_baton(KEYS[2], ARGV[1])
return 1

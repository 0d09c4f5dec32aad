-- holder: who holds the lock, read atomically.
--
-- KEYS[1]  lock key   (hash: flag, count, fence)
--
-- Returns {} when the lock is free, otherwise
--         {owner identity, depth, fencing token, remaining lease in ms (-1: none)}
local held = redis.call('HMGET', KEYS[1], 'flag', 'count', 'fence')
if held[1] == false then
  return {}
end
return {held[1], tonumber(held[2]), tonumber(held[3]), redis.call('PTTL', KEYS[1])}

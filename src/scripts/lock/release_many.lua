-- release_many: a Redlock quorum's release of a multi-lock's names on one
-- master, in one call: each name released exactly as release.lua releases
-- one lock (same checks, same writes, same reply), one after the other.
-- Unlike acquire_many.lua this is not all or none: each release stands on
-- its own, as the releases of one pipeline would (a quorum's round carries
-- one call per master, hence one script instead of a pipeline).
--
-- KEYS[2i-1]  lock key of name i   (hash: flag, count, fence, req, waited)
-- KEYS[2i]    baton key of name i  (list holding at most one "ok" token)
-- ARGV[1]     baton TTL in milliseconds
-- ARGV[2]     the hand-over window in milliseconds, as release.lua's
-- then per name i, from ARGV[3]:
-- ARGV[4i-1]  identity of the caller
-- ARGV[4i]    fencing token of the caller's ownership of name i
-- ARGV[4i+1]  the caller's live guards of name i after this release
-- ARGV[4i+2]  the ownership's lease in milliseconds
--
-- Returns one reply per name, in order: release.lua's (-1 not the owner,
-- depth > 0 an inner release, 0 freed), or, when the name's baton key is
-- not a list, that error's message as a string (the name left as it was):
-- an error reply inside the array would fail the whole reply, and with it
-- the other names' answers.
--
-- Keep in step with release.lua. The script as built begins with
-- lock/usual/release_many.lua, which reads the first name's lock (`first`)
-- and releases one name nobody asked for; then extend_lease, baton_error,
-- push_baton and hand_over come from lib/, and this file, the other paths.
local reply = {}
for i = 1, #KEYS / 2 do
  local lock, baton = KEYS[2 * i - 1], KEYS[2 * i]
  local identity, fence = ARGV[4 * i - 1], ARGV[4 * i]
  local depth, lease = tonumber(ARGV[4 * i + 1]), ARGV[4 * i + 2]
  local held = first
  if i > 1 then
    held = redis.call('HMGET', lock, 'flag', 'fence', 'waited', 'queued', 'since')
  end
  if held[1] ~= identity or held[2] ~= fence then
    reply[i] = -1
  elseif depth > 0 then
    redis.call('HSET', lock, 'count', depth)
    extend_lease(lock, lease)
    reply[i] = depth
  elseif not held[3] then
    redis.call('DEL', lock)
    reply[i] = 0
  else
    local err = baton_error(baton)
    if err then
      reply[i] = err['err']
    else
      redis.call('DEL', lock)
      if held[4] then
        hand_over(lock, ARGV[2], held[4], held[5])
      end
      push_baton(baton, ARGV[1])
      reply[i] = 0
    end
  end
end
return reply

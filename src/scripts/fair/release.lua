-- fair/release: release one guard of a fair lock; the last guard frees the
-- lock and names the head of the queue, to be woken.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req, waited)
-- KEYS[2]  queue
-- KEYS[3]  places
-- ARGV[1]..ARGV[4]  as lock/release.lua: identity, fence, the caller's
--                   live guards after this release, the ownership's lease
--
-- Returns {code, head}: code as lock/release.lua (-1 not the owner,
-- nothing changed; > 0 the depth left; 0 freed); head is the waiter whose
-- list the client pushes next (fair/wake.lua), '' for none. Only an
-- ownership somebody asked for meanwhile (`waited`), or a lock found
-- free by a caller that no longer owns it, looks for one.
-- extend_lease and the queue helpers come from lib/.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'waited')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  -- Not ours. When nobody holds the lock (a first run of this release
  -- freed it and its reply was lost, or the lease ran out), the head is
  -- named all the same: else it would sleep out its park. Waking it when
  -- it need not wake costs it one look.
  if not held[1] then
    local err = queue_error(KEYS[2], KEYS[3])
    if err then
      return err
    end
    return {-1, head_to_wake(KEYS[2], KEYS[3])}
  end
  return {-1, ''}
end

local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[1], 'count', depth)
  extend_lease(KEYS[1], ARGV[4])
  return {depth, ''}
end

local err = queue_error(KEYS[2], KEYS[3])
if err then
  return err
end
redis.call('DEL', KEYS[1])
if not held[3] then
  return {0, ''}
end
return {0, head_to_wake(KEYS[2], KEYS[3])}

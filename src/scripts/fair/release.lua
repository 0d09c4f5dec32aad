-- fair/release: release one guard of a fair lock; the last guard frees the
-- lock and wakes the head of the queue, or names it, to be woken.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req, waited, next)
-- KEYS[2]  queue
-- KEYS[3]  places
-- KEYS[4]  the head's list (FairKeys::next, see fair/acquire.lua); left
--          out only while the lock's slot migrates (below)
-- KEYS[5]  optional, with ARGV[6]: the own list of the waiter the
--          ownership's acquisition found first in the queue (its guess of
--          the head this release wakes); never without KEYS[4]
-- ARGV[1]..ARGV[4]  as lock/release.lua: identity, fence, the caller's
--                   live guards after this release, the ownership's lease
-- ARGV[5]  baton TTL in milliseconds
-- ARGV[6]  with KEYS[5]: that waiter's identity; else ""
-- ARGV[7], ARGV[8], ...  pairs of a waiter and its arrival: the threads of
--          the caller's client this ownership was passed to in memory
--          (fair/acquire.lua's `line`). Their places are still in the
--          queue, first; a last release drops each that still has that
--          arrival (one that asked again since arrived anew, and stays),
--          and wakes the head behind them.
--
-- Returns {code, head, parked_on}: code as lock/release.lua (-1 not the
-- owner, nothing changed; > 0 the depth left; 0 freed); head is the
-- waiter the client wakes next ('' for none): in memory when it is one of
-- the client's own, else by pushing its list (fair/wake.lua); parked_on
-- says which list that is: 0 its own, 1 the head's list, 2 either (not
-- known: both are pushed).
--
-- A head that is another client's is woken here, with no second call,
-- when the release names its list: the head's list, where the lock's
-- `next` says it parks, or its own list, where it is the waiter the
-- acquisition guessed (KEYS[5]; in steady contention, the head became
-- the head while parked, behind the waiter that acquired). A `next` that
-- names another waiter than the head is woken off the head's list the
-- same way. Only an ownership somebody asked for meanwhile (`waited`), or
-- a lock found free by a caller that no longer owns it, looks for a head.
--
-- While its slot migrates, Redis refuses a script that names a key the
-- node does not have beside ones it has (TRYAGAIN, before it runs), and
-- the head's list is mostly empty (no key): the client then sends the
-- release again without KEYS[4] and KEYS[5], and the head, wherever it
-- parks, is named for the client to wake.
-- extend_lease, the queue and baton helpers come from lib/.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'waited', 'next')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  -- Not ours. When nobody holds the lock (a first run of this release
  -- freed it and its reply was lost, or the lease ran out), the head is
  -- named all the same: else it would sleep out its park. Waking it when
  -- it need not wake costs it one look. Where it parks is not known any
  -- more: on either list.
  if not held[1] then
    local err = queue_error(KEYS[2], KEYS[3])
    if err then
      return err
    end
    local head, drop = head_after_drops(KEYS[2], KEYS[3], 7)
    drop_places(KEYS[2], KEYS[3], drop)
    return {-1, head, 2}
  end
  return {-1, '', 0}
end

local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[1], 'count', depth)
  extend_lease(KEYS[1], ARGV[4])
  return {depth, '', 0}
end

local err = queue_error(KEYS[2], KEYS[3])
  or (KEYS[4] and baton_error(KEYS[4]))
  or (KEYS[5] and baton_error(KEYS[5]))
if err then
  return err
end
-- Nobody asked for this ownership (`waited`), and nobody was served in
-- memory: nothing to drop, nobody to wake.
if not held[3] and #ARGV < 7 then
  redis.call('DEL', KEYS[1])
  return {0, '', 0}
end
local head, drop = head_after_drops(KEYS[2], KEYS[3], 7)
redis.call('DEL', KEYS[1])
drop_places(KEYS[2], KEYS[3], drop)
if not held[3] then
  return {0, '', 0}
end
local on_heads_list = head == held[4]
if held[4] and not on_heads_list and KEYS[4] then
  -- The waiter recorded as the head no longer is (another came back to
  -- an earlier place): parked on the head's list, it would miss its
  -- wake-up once it is the head again, which comes on its own list. A
  -- token there sends it back to look (and park on its own list).
  push_baton(KEYS[4], ARGV[5])
end
local parked_on = on_heads_list and 1 or 0
local list
if on_heads_list then
  list = KEYS[4]
elseif ARGV[6] ~= '' and head == ARGV[6] then
  list = KEYS[5]
end
-- An identity is `<client instance>:<n>`: a head of the releasing client
-- is one of its own threads, woken in memory if it is parked now.
local client = string.match(ARGV[1], '^(.*:)')
if head == '' or not list or (client and string.sub(head, 1, #client) == client) then
  return {0, head, parked_on}
end
push_baton(list, ARGV[5])
return {0, '', 0}

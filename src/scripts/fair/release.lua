-- fair/release: release one guard of a fair lock; the last guard frees the
-- lock and wakes the head of the queue, or names it, to be woken.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req, waited, next, and
--          nspec: the grant spec of `next`, see fair/acquire.lua)
-- KEYS[2]  queue
-- KEYS[3]  places
-- KEYS[4]  the head's list (FairKeys::next, see fair/acquire.lua); left
--          out only while the lock's slot migrates (below), with KEYS[5]
-- KEYS[5]  the fence key (for a grant)
-- KEYS[6]  optional, with ARGV[6]: the own list of the waiter the
--          ownership's acquisition found first in the queue (its guess of
--          the head this release wakes); never without KEYS[4]
-- KEYS[7]  optional, with KEYS[6] and ARGV[8]: that waiter's grant spec
--          (LockKeys::grant_spec, written by its attempts)
-- ARGV[1]..ARGV[4]  as lock/release.lua: identity, fence, the caller's
--                   live guards after this release, the ownership's lease
-- ARGV[5]  baton TTL in milliseconds
-- ARGV[6]  with KEYS[6]: that waiter's identity; else ""
-- ARGV[7]  the fence counter's TTL in ms, for a grant; else ""
-- ARGV[8]  where the deployment allows grants (one server, or Sentinel's
--          master without replica acknowledgements), the prefix of the
--          clients' grant channels; else "". A last release that would
--          wake a head of another client on a list it declares (the
--          head's list, the guessed head's own) grants it the lock
--          instead, when its spec is there and its client hears it
--          (lib/grant.lua); the threads of that client behind it in the
--          queue (up to the spec's number) are passed with the grant, as
--          fair/acquire.lua's `line` of a fresh acquisition
-- ARGV[9], ARGV[10], ...  pairs of a waiter and its arrival: the threads of
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
-- acquisition guessed (KEYS[6]; in steady contention, the head became
-- the head while parked, behind the waiter that acquired). A `next` that
-- names another waiter than the head is woken off the head's list the
-- same way. A head of another client whose grant spec the release finds
-- (beside `next`, or in the guessed head's spec key) is granted the lock
-- instead (ARGV[8]): the head that asked once the lock was held as well as
-- the one that became the head while parked.
-- Only an ownership somebody asked for meanwhile (`waited`), or
-- a lock found free by a caller that no longer owns it, looks for a head.
--
-- While its slot migrates, Redis refuses a script that names a key the
-- node does not have beside ones it has (TRYAGAIN, before it runs), and
-- the head's list is mostly empty (no key): the client then sends the
-- release again without KEYS[4] to KEYS[7], and the head, wherever it
-- parks, is named for the client to wake.
-- extend_lease, the queue and baton helpers come from lib/.
-- grant_head(head, list, spec): grants the lock (deleted) to `head`,
-- parked on `list`, with the line of its client's threads behind it, if
-- `spec` is its grant spec and its client hears the grant; whether it did.
local function grant_head(head, list, spec)
  local req, lease, most = grant_spec(spec or '')
  if not req then
    return false
  end
  most = tonumber(most)
  local waiting = redis.call('ZRANGE', KEYS[2], 0, math.max(most, 1), 'WITHSCORES')
  local line, after, first = line_of(waiting, head, most)
  local behind = table.concat(line, ',') .. ';' .. ((#line > 0 and after) or (#line == 0 and first) or '')
  if not grant(KEYS[1], list, KEYS[5], ARGV[7], ARGV[8], head, req, lease, tostring(#line / 2), behind) then
    return false
  end
  -- The head's place stays first in the queue, as its line's do, until
  -- its run's last release drops it (its client counts it served): a
  -- grant its client gives back (no thread of it took it) then wakes it
  -- again, in its turn. The place ends with the grant's lease, so that a
  -- grantee that is gone costs the others that much, not a place's life.
  redis.call('ZADD', KEYS[3], server_ms() + tonumber(lease), head)
  return true
end

local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'waited', 'next', 'nspec')
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
    local head, drop = head_after_drops(KEYS[2], KEYS[3], 9)
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
  or (KEYS[6] and baton_error(KEYS[6]))
if err then
  return err
end
-- Nobody asked for this ownership (`waited`), and nobody was served in
-- memory: nothing to drop, nobody to wake.
if not held[3] and #ARGV < 9 then
  redis.call('DEL', KEYS[1])
  return {0, '', 0}
end
local head, drop = head_after_drops(KEYS[2], KEYS[3], 9)
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
  list = KEYS[6]
end
-- An identity is `<client instance>:<n>`: a head of the releasing client
-- is one of its own threads, woken in memory if it is parked now.
local client = string.match(ARGV[1], '^(.*:)')
if head == '' or not list or (client and string.sub(head, 1, #client) == client) then
  return {0, head, parked_on}
end
if ARGV[8] ~= '' then
  -- The head's spec: beside `next` when it parks on the head's list (its
  -- attempt that found itself the head wrote both), else in its spec key
  -- when it is the guessed head (KEYS[7]).
  local spec = on_heads_list and held[5] or nil
  if not spec and head == ARGV[6] and KEYS[7] then
    spec = redis.call('GET', KEYS[7])
  end
  if spec and grant_head(head, list, spec) then
    return {0, '', 0}
  end
end
push_baton(list, ARGV[5])
return {0, '', 0}

-- fair/acquire: take the fair lock in arrival order, re-enter it, or take
-- (and keep) a place in its queue of waiters.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, req, waited), as acquire.lua;
--          and `next`, `nspec` (see below)
-- KEYS[2]  fence key  (string: per-lock fencing counter)
-- KEYS[3]  queue      (sorted set: waiter -> arrival, server µs)
-- KEYS[4]  places     (sorted set: waiter -> end of its place, server ms)
-- ARGV[1]..ARGV[6]  as acquire.lua: identity, lease ms, held fence, depth,
--                   fence counter TTL ms, request number
-- ARGV[7]  "1" when the caller waits: it takes or renews its place in the
--          queue; "0" for a single attempt (try_lock), which takes no place
-- ARGV[8]  how long a place lives without being renewed, in ms
-- ARGV[9]  the caller's arrival (server µs) as an earlier attempt of this
--          wait returned it, "0" before it has one
-- KEYS[5]  only when ARGV[10] or ARGV[11] is "1": the list the caller
--          last parked on (its own, LockKeys::wake_list, or the head's
--          list, FairKeys::next)
-- ARGV[10] "1" from a waiter whose park ended when that list changed,
--          with no look that popped its token (the parking hub rings such
--          a waiter at the list's announcement): its token is popped
--          before the first write, whatever comes of the attempt, as the
--          look would have popped it (but by a request sent again that
--          finds its ownership: its first send popped it); else "0"
-- ARGV[11] "1" when that list is the head's list, else "0"
-- ARGV[12] the most waiters of the caller's client an ownership taken
--          afresh may be passed to in memory ("0": none), see `line` below
-- ARGV[13] "1" when the lock must be free to be taken: the caller has no
--          live guards, and another thread of its client holds what the
--          caller took under its identity (passed on in memory), so a lock
--          under the caller's identity is that thread's, not a leftover
-- ARGV[14] the grant's lease in ms where a release may grant the lock to
--          the caller while it waits (lib/grant.lua), else "0"; with it,
--          the last key is the caller's grant spec (LockKeys::grant_spec),
--          which an attempt that leaves the caller waiting writes, for as
--          long as its place lives: `<request> <lease> <ARGV[12]>`
--          (fair/release.lua reads it)
--
-- Returns {1, fence, depth}         acquired: fresh (depth 1) or re-entered
--         {1, fence, 1, next}       acquired afresh with others waiting:
--                                   `next` is the head of the queue now,
--                                   whom the release will likely wake
--                                   (see fair/release.lua)
--         {1, fence, 1, next, line} the same, where the first waiters
--                                   behind the caller are threads of its
--                                   client: `line` is {waiter, arrival,
--                                   ...} for each of them, in queue order,
--                                   up to ARGV[12] of them, and as many
--                                   tokens above `fence` are set aside (see
--                                   next_fence) for the client to pass the
--                                   ownership along that line in memory;
--                                   their places stay until the run's last
--                                   release drops them (fair/release.lua)
--         {1, fence, 1, next, line, after}  the same, with the waiter
--                                   behind the line (whom the run's last
--                                   release will likely wake)
--         {0, wait, arrival, head}  not this caller's turn; `wait` is how
--                                   long, in ms, until something may change
--                                   without a wake-up: the holder's
--                                   remaining lease, or, for a free lock
--                                   with others ahead, the end of the head's
--                                   place (-1: no expiry); `arrival` is the
--                                   caller's arrival in the queue (0: no
--                                   place); `head` is 1 when the caller is
--                                   the head of the queue behind a holder,
--                                   and parks on the head's list, else 0
--
-- The head's list spares a release its second call: a release names the
-- head for the client to push the head's own list (a key a script cannot
-- declare: it learns the name only as it runs), but a waiter that finds
-- itself the head behind a holder is recorded in the lock's hash
-- (`next`), parks on the head's list (which a release declares), and the
-- release that finds it still the head pushes that list itself. A waiter
-- that parked there and finds the lock free but somebody else the head
-- (who came back to an earlier place) pushes that list again: the token
-- that woke it may have been the head's. A waiter that became the head
-- while it was parked (behind one that went first) never made that
-- attempt: a fresh acquisition names it, and the release declares its own
-- list from that guess. Beside `next`, a head that may be granted the lock
-- (ARGV[14]) leaves its grant spec (`nspec`), so that the release that
-- finds it still the head grants it the lock, as it grants a guessed head
-- from its spec key.
--
-- While its slot migrates, Redis refuses a script that names a key the
-- node does not have beside ones it has (TRYAGAIN, before it runs); the
-- client then sends the attempt again without KEYS[5] (and "0", "0"): a
-- token left on that list costs a waiter one look.
--
-- The lock is free for the caller only when nobody waits ahead of it: the
-- queue is empty or the caller is its head. A newcomer never barges past a
-- waiter. Dead waiters' places are dropped first. A waiter whose place was
-- dropped while it still lived (it came back late: a slow machine, a
-- server tick late) takes its place again at its first arrival, which it
-- sends back at every attempt, so it never loses its turn to later ones.
-- A call's first attempt (ARGV[9] "0") always arrives anew: a place the
-- caller still has is an earlier call's, left in the queue by a run that
-- passed the lock to it in memory.
-- An ownership taken while others wait carries the `waited` mark, so that
-- its release wakes the new head.
--
-- The same request sent twice (its first reply lost) finds its own
-- ownership by its request number and is told it acquired: it is not
-- refused because someone queued meanwhile, which would leave the lock
-- held by nobody's guard for a lease.
-- next_fence, extend_lease, the queue and baton helpers come from lib/.
local queue, places = KEYS[3], KEYS[4]
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'req', 'count', 'next', 'waited')

if held[1] == ARGV[1] and held[2] == ARGV[3] then
  redis.call('HSET', KEYS[1], 'count', ARGV[4])
  extend_lease(KEYS[1], ARGV[2])
  return {1, tonumber(held[2]), tonumber(ARGV[4])}
end
if held[1] == ARGV[1] and held[3] == ARGV[6] then
  return {1, tonumber(held[2]), tonumber(held[4])}
end

-- One reading of the clock for the whole attempt: the places' ends (ms),
-- an arrival (µs) and the fencing token.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- The first waiters: the head (past the caller's own place, below), and
-- the first behind it; and the places to drop, read before any write.
local dead, first, err = read_queue(queue, places, now, 3)
if err then
  return err
end
if ARGV[10] == '1' then
  redis.call('LPOP', KEYS[5])
end
for _, waiter in ipairs(dead) do
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', places, waiter)
end
local head = first[1]
-- A call's first attempt has no place yet: one under the caller's
-- identity is an earlier call's (see above), and not its turn.
if head == ARGV[1] and ARGV[9] == '0' then
  head = first[2]
end

-- A lock under the caller's identity that no live guard of its holds (a
-- request or a hand-off whose reply was lost, see fair/handoff.lua) came
-- to it in its turn: it is taken afresh whoever the head is now (the
-- hand-off dropped the caller's place). Not while another thread of the
-- caller's client holds it (ARGV[13]).
local leftover = held[1] == ARGV[1] and ARGV[13] ~= '1'
if leftover or (held[1] == false and (head == nil or head == ARGV[1])) then
  -- The waiters behind the caller, read before the caller's place goes:
  -- no key is read after a write may have deleted it (the caller's place
  -- the last of the queue), nor deleted and written again (a leftover
  -- lock): while the slot migrates, Redis refuses a script's command on a
  -- key the node does not have, after the writes before it.
  local next_in_line
  for _, waiter in ipairs(first) do
    if waiter ~= ARGV[1] then
      next_in_line = waiter
      break
    end
  end
  -- `line`: the first of them, while they are threads of the caller's
  -- client (read only when the first is one), and the one `after` them.
  local most = tonumber(ARGV[12])
  local client = string.match(ARGV[1], '^(.*:)')
  local line, after = {}, nil
  if most > 0 and client and next_in_line and string.sub(next_in_line, 1, #client) == client then
    line, after = line_of(redis.call('ZRANGE', queue, 0, most, 'WITHSCORES'), ARGV[1], most)
    for i = 2, #line, 2 do
      line[i] = tonumber(line[i])
    end
  end
  local reserve = nil
  if #line > 0 then
    reserve = tostring(#line / 2)
  end
  local fence, ferr, token = next_fence(KEYS[2], ARGV[5], nil, reserve, clock)
  if ferr then
    return ferr
  end
  redis.call('ZREM', queue, ARGV[1])
  redis.call('ZREM', places, ARGV[1])
  if held[1] then
    -- A leftover of the caller's: nothing of it (a `next`) stays.
    redis.call('HDEL', KEYS[1], 'next', 'nspec', 'waited')
  end
  if next_in_line then
    redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', '1', 'fence', token, 'req', ARGV[6], 'waited', '1')
  else
    redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', '1', 'fence', token, 'req', ARGV[6])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if next_in_line then
    if #line > 0 then
      -- Without an `after` (nil), the reply ends with the line.
      return {1, fence, 1, next_in_line, line, after}
    end
    return {1, fence, 1, next_in_line}
  end
  return {1, fence, 1}
end

local arrival, is_head = 0, 0
if ARGV[7] == '1' then
  local stored = nil
  if ARGV[9] ~= '0' then
    stored = tonumber(redis.call('ZSCORE', queue, ARGV[1]))
  end
  arrival = stored or tonumber(ARGV[9])
  if not stored then
    if arrival == 0 then
      arrival = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    redis.call('ZADD', queue, arrival, ARGV[1])
  end
  redis.call('ZADD', places, now + tonumber(ARGV[8]), ARGV[1])
  keep_queue(queue, places, ARGV[8])
  local spec = ARGV[6] .. ' ' .. ARGV[14] .. ' ' .. ARGV[12]
  if ARGV[14] ~= '0' then
    redis.call('SET', KEYS[#KEYS], spec, 'PX', ARGV[8])
  end
  if held[1] then
    if head == nil or head == ARGV[1] then
      is_head = 1
      -- With its grant spec (`nspec`), for the release that finds it
      -- still the head to grant it the lock (fair/release.lua); a head
      -- that may not be granted leaves no spec, not even its
      -- predecessor's.
      if ARGV[14] ~= '0' then
        redis.call('HSET', KEYS[1], 'waited', '1', 'next', ARGV[1], 'nspec', spec)
      else
        redis.call('HSET', KEYS[1], 'waited', '1', 'next', ARGV[1])
        redis.call('HDEL', KEYS[1], 'nspec')
      end
    else
      -- Marked once per ownership (the arrivals behind a long hold each
      -- find the mark).
      if held[6] ~= '1' then
        redis.call('HSET', KEYS[1], 'waited', '1')
      end
      if held[5] == ARGV[1] then
        -- Recorded as the head in an earlier wait (a run served it in
        -- memory since): it parks on its own list now.
        redis.call('HDEL', KEYS[1], 'next', 'nspec')
      end
    end
  end
end

if held[1] then
  return {0, redis.call('PTTL', KEYS[1]), arrival, is_head}
end
-- Free, but the head (another waiter) has not taken it yet: it was woken;
-- look again when its place would end, in case it died meanwhile.
if ARGV[11] == '1' then
  local err = baton_error(KEYS[5])
  if err then
    return err
  end
  -- For as long as a place lives: the head comes back within it.
  push_baton(KEYS[5], ARGV[8])
end
local head_place = tonumber(redis.call('ZSCORE', places, head) or now)
return {0, math.max(head_place - now, 1), arrival, 0}

-- acquire: take k permits under a new permit id with a lease, or say how
-- many are available and when the first holder's lease ends.
--
-- KEYS[1..6]  state, holders, counts, waiters, baton, reserved baton (see
--             lib/permits.lua)
-- KEYS[7]     with ARGV[9]: the grant specs (see lib/permits.lua)
-- ARGV[1]     the permit id: "<thread identity>:<request number>", unique
--             per attempt
-- ARGV[2]     k, the permits wanted (1 to 10^12)
-- ARGV[3]     the lease in milliseconds
-- ARGV[4]     the caller's place among the waiters, "<k>:<identity>", or ""
--             for a caller that will not wait (try_acquire)
-- ARGV[5]     how long a place lasts without a new attempt, in milliseconds
--             (the longest park, plus a margin)
-- ARGV[6]     baton TTL in milliseconds
-- ARGV[7]     when the caller has waited long enough to hold newcomers
--             back (see reservation in lib/permits.lua): how long, in
--             milliseconds, a reservation it makes or holds lasts unless it
--             comes back; else "0"
-- ARGV[8]     "1" from a waiter whose park ended when the baton list
--             changed, with no look that popped its token (the parking hub
--             rings such a waiter at the list's announcement): the token is
--             popped first, whatever comes of the attempt, as the look
--             would have popped it for this waiter (a list of another type
--             fails the pop before anything changed); else "0"
-- ARGV[9]     (with KEYS[7]) from a waiter that parks where a grant
--             reaches it: "<request> <grant lease ms>", this attempt's
--             request number (the id's last part) and how long a grant's
--             lease lasts; kept as its place's spec when it is short, so
--             that a release may grant it the permits (see release.lua)
--
-- Returns {1, k}                 acquired; also when this permit id holds
--                                its permits already (the same request,
--                                sent again after its reply was lost)
--         {0, available, left, reserving, passed}
--                                not enough permits; nothing held; `left`
--                                is the time in ms until the first holder's
--                                lease ends (-1: no holder); `reserving` 1
--                                when the caller's place holds newcomers
--                                back (it parks on KEYS[6]), else 0;
--                                `passed`: how many tokens it pushed for
--                                other waiters (see wake)
--         {-1}                   no total was ever set
--         {-2, total}            k is over the total: waiting would never end
--         {-3, field}            the state is damaged (1: total, 2: used)
--
-- First, holders whose lease ended are removed and their permits returned
-- (purge). A caller that waits keeps a place in the waiters set, refreshed
-- here at each of its attempts and removed when it acquires (or by the
-- client when it gives up), so that releases push a token for it; one that
-- is short passes on a token it may have taken from another (see wake).
-- Not first-come first-served: whoever asks when permits are free gets them,
-- except those set aside for a waiter that has waited long (the
-- reservation, one at a time, made here by such a waiter that is short,
-- or taken over by one that wants more permits): a try_acquire, a newcomer
-- and every other waiter take only permits beyond the reserving waiter's
-- k.
if ARGV[8] == '1' then
  redis.call('LPOP', KEYS[5])
end
local id = ARGV[1]
local k = tonumber(ARGV[2])
local place = ARGV[4]
local now = server_ms()
-- Every key is read before the first write (sem_look), so that a key of
-- another type fails the call with nothing changed.
local look, err = sem_look(id, now)
if not look then
  return err
end
local st, reply = read_state(look.stored)
if not st then
  return reply
end
local purged = purge(st, now, look.expired)

-- holders and counts always agree (every script writes both): an id that
-- holds nothing has no count, and the holders are looked at only for one
-- that has.
if look.held and redis.call('ZSCORE', KEYS[2], id) then
  -- Also a waiter's request whose permits a release granted while the
  -- reply to it was lost: the lease moves on from the grant's, so that
  -- its client's give-back of the grant (which names the grant's end, see
  -- release.lua) leaves them.
  redis.call('ZADD', KEYS[2], 'GT', int(now + tonumber(ARGV[3])), id)
  leave_place(look, place)
  save(st)
  return {1, tonumber(look.held)}
end

if k > st.total then
  leave_place(look, place)
  save(st)
  return {-2, st.total}
end

local available = math.max(0, st.total - st.used)
local first, first_k = reservation(st, now)
local free = available
if first and first ~= place then
  free = math.max(0, available - first_k)
end
if k <= free then
  st.used = st.used + k
  redis.call('ZADD', KEYS[2], int(now + tonumber(ARGV[3])), id)
  redis.call('HSET', KEYS[3], id, ARGV[2])
  leave_place(look, place)
  if first == place then
    st.reserved = false
    -- A token pushed for it while it was on its way is of no use to the
    -- next waiter to reserve.
    if (look.reserved_tokens or 0) > 0 then
      redis.call('DEL', KEYS[6])
    end
  end
  st.passes = 0
  wake(st, now, ARGV[6], false, look.waiters, look.tokens, look.reserved_tokens)
  save(st)
  return {1, k}
end

if place ~= '' then
  local ttl = tonumber(ARGV[5])
  redis.call('ZADD', KEYS[4], int(now + ttl), place)
  if redis.call('PTTL', KEYS[4]) < ttl then
    redis.call('PEXPIRE', KEYS[4], ttl)
  end
  local hold = tonumber(ARGV[7])
  -- A waiter for more permits than the reserving one takes the
  -- reservation over: takers of fewer, waiting their turn as long, would
  -- otherwise hand it on among themselves (they are woken whenever a
  -- permit is freed) while it stays parked, woken only when all its
  -- permits are free, which is never until it reserves them.
  if hold > 0 and (not first or first == place or k > first_k) then
    st.reserved = place
    st.reserved_end = now + hold
  end
end
if purged > 0 then
  st.passes = 0
end
-- The waiters read at the start are out of date when this call placed its
-- caller: wake reads them again.
local waiters = look.waiters
if place ~= '' then
  waiters = nil
end
local passed = wake(st, now, ARGV[6], place, waiters, look.tokens, look.reserved_tokens)
save(st)
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local left = -1
if first[2] then
  left = math.max(0, tonumber(first[2]) - now)
end
-- Whether the caller holds newcomers back: it parks on the reserved baton.
local reserving = 0
if place ~= '' and st.reserved == place then
  reserving = 1
end
if place ~= '' and KEYS[7] then
  -- Its spec names the list it parks on, where its grant is told.
  local on = 'b'
  if reserving == 1 then
    on = 'r'
  end
  redis.call('HSET', KEYS[7], place, ARGV[9] .. ' ' .. on)
  local ttl = tonumber(ARGV[5])
  if redis.call('PTTL', KEYS[7]) < ttl then
    redis.call('PEXPIRE', KEYS[7], ttl)
  end
end
return {0, available, left, reserving, passed}

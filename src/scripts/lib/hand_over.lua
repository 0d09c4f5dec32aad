-- The hand-over window. A release that frees a lock a waiter of another
-- client found in its way (the `queued` mark: an attempt of a caller that
-- had already waited met this ownership) wakes that client's parked waiter
-- with its baton, and the waiter needs a few round trips to come (an
-- announcement, a pop, an attempt). A thread that releases and asks again
-- at once needs one, so without a window it would take the lock back every
-- time and the waiters of other clients would starve. For `ms` after such
-- a release the lock key holds only `handover` (no `flag`: nobody holds
-- it), the server time (µs) the window opened, and the waiter it is kept
-- for (`for`, asking since `since`).
--
-- Who may take it:
-- * the waiter it is kept for, whenever its attempt arrives: of the waiters
--   of other clients than the holder's that found the ownership in its
--   way, the one asking longest (see mark_in_the_way);
-- * for the window's first KEPT_ONLY_US, nobody else but a `try_lock`
--   (which would not wait), a multi-lock's caller (its script does not
--   name the batons, so it could not tell the kept waiter: see
--   tell_kept_waiter) and a Redlock quorum's (its waiters park through a
--   window as through a hold), which are admitted as below;
-- * after that, also a caller that has been asking since before the
--   window opened: by causality, a call that began after its thread saw
--   the release reply has asked for less time than the window has been
--   open when its attempt arrives.
-- Any other caller (a newcomer, a thread that queued behind its own
-- process's waiters after the release, another process's parker while the
-- window is kept) is told what is left of the window ({0, pttl, -1}) and
-- looks again within that time (see LAST_WINDOW_LOOK in
-- src/parking/mod.rs). A waiter among them is marked on the window as
-- the one to keep the next window for (`next`, asking since `nsince`;
-- the one asking longest, as mark_in_the_way keeps), and whoever takes
-- the window carries that mark into its ownership (take_window): so a
-- waiter kept out of one window is kept the next one, as if it had found
-- the next ownership in its way, though that ownership began and may end
-- before it looks again.
--
-- Why one waiter, by identity: the comparison of times is of the caller's
-- clock when it sent its attempt with the server's when it runs, so it is
-- off by the attempt's way there. A waiter that began asking shortly before
-- the release, whose attempt is held up (a loaded machine, a slow network),
-- would be taken for a newcomer and wait the window out, with every waiter
-- of its process behind it.
--
-- Why the longest-asking waiter of another client, and why alone at
-- first: the waiters of a plain lock's processes are not ordered, and each
-- release wakes one parker per process. When whichever came first took the
-- lock, a process whose parker was a little slower could lose a hundred
-- hand-offs in a row. Now a process's threads pass the lock among
-- themselves in memory for a bounded run (max_local_handoffs,
-- max_local_run), and its release in Redis goes to the waiter of another
-- process that has waited longest: the processes take turns. A waiter of
-- the holder's own client is kept no window: its process serves it in
-- memory, or by a release with nobody else waiting.
--
-- A kept waiter that never comes (its wait ended, its process died) costs
-- the others KEPT_ONLY_US and a look, and newcomers at most the window. A
-- first attempt or a `try_lock` that finds the lock held does not mark it
-- `queued`: a lock nobody has parked for is free at its release.
--
-- The scripts tell callers apart by one number, `asking`: -1 a try_lock, 0
-- a first attempt, else the microseconds the caller has been asking.

-- server_us(): the server's time in microseconds, as an exact decimal
-- string (a Lua number this large would be written with 14 digits).
local function server_us()
  local now = redis.call('TIME')
  return now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
end

-- The first part of a window (µs) in which only the waiter it is kept for
-- may take it: a few of that waiter's round trips (it was woken by the same
-- announcement as the others), with room for a loaded machine.
local KEPT_ONLY_US = 10000

-- same_client(a, b): whether identities `a` and `b` (`<client>:<n>`) are
-- threads of one client.
local function same_client(a, b)
  return string.match(a, '^[^:]*') == string.match(b, '^[^:]*')
end

-- mark_in_the_way(key, holder, marked, marked_since, identity, asking,
-- grant): caller `identity`, `asking`, found the ownership of `holder` in
-- its way, whose `queued` waiter (if any) is `marked`, asking since
-- `marked_since`. The ownership's release must push a baton (`waited`,
-- `seen`: see lock/acquire.lua), and its window is kept for the caller if
-- it has waited (a parker), is of another client than the holder's, and
-- has asked longer than the waiter marked before it. `grant` (or nil): how
-- the release may grant the lock to the caller instead (lib/grant.lua:
-- the request it parks after, its lease, its reserve), kept with the mark
-- and brought up to date by each attempt of the marked waiter, so that it
-- names the request its latest park follows.
local function mark_in_the_way(key, holder, marked, marked_since, identity, asking, grant)
  if asking > 0 and not same_client(holder, identity) then
    if marked == identity then
      if grant then
        redis.call('HSET', key, 'grant', grant)
      else
        redis.call('HDEL', key, 'grant')
      end
      return
    end
    local since = tonumber(server_us()) - asking
    if not marked_since or since < tonumber(marked_since) then
      local at = string.format('%.0f', since)
      if grant then
        redis.call('HSET', key, 'waited', 1, 'seen', 1, 'queued', identity, 'since', at, 'grant', grant)
      else
        redis.call('HSET', key, 'waited', 1, 'seen', 1, 'queued', identity, 'since', at)
        if marked then
          redis.call('HDEL', key, 'grant')
        end
      end
      return
    end
  end
  redis.call('HSET', key, 'waited', 1, 'seen', 1)
end

-- hand_over(key, ms, waiter, since): after the lock key was deleted, opens
-- the window ("0": none), kept for `waiter` (the identity in `queued`,
-- asking since `since`, or false: marked by an older client, which
-- recorded no time and keeps no window to itself).
local function hand_over(key, ms, waiter, since)
  if ms ~= '0' then
    if since then
      redis.call('HSET', key, 'handover', server_us(), 'for', waiter, 'since', since)
    else
      redis.call('HSET', key, 'handover', server_us(), 'for', waiter)
    end
    redis.call('PEXPIRE', key, ms)
  end
end

-- mark_next(key, kept_for, next_since, identity, asking): caller
-- `identity`, `asking`, was kept out of a window kept for `kept_for`, on
-- which the waiter marked to keep the next window for (if any) began
-- asking at `next_since`. A waiter (it has waited) that has asked longer
-- than that one is marked instead (see take_window).
local function mark_next(key, kept_for, next_since, identity, asking)
  if asking > 0 and identity ~= kept_for then
    local since = tonumber(server_us()) - asking
    if not next_since or since < tonumber(next_since) then
      redis.call('HSET', key, 'next', identity, 'nsince', string.format('%.0f', since))
    end
  end
end

-- take_window(key, identity, token, req, asking, next, next_since): writes
-- the ownership of `identity` (fencing token `token`, request `req`,
-- `asking` as the caller asks) over a lock in its hand-over window, then
-- takes the window's fields off. The waiter the window marked next
-- (mark_next: `next`, asking since `next_since`, or false) is carried
-- into the ownership as in its way, as that waiter's attempt would have
-- marked it (mark_in_the_way: `queued`, `since`, `waited`, `seen`);
-- unless the window marked nobody, or a thread of the taker's own client
-- (its process serves it in memory). Not DEL first: while the slot
-- migrates, a key the script deleted counts as moved, and Redis refuses
-- the script's next write to it ("a non local key").
local function take_window(key, identity, token, req, asking, next, next_since)
  if next and next_since and not same_client(next, identity) then
    redis.call('HSET', key, 'flag', identity, 'count', '1', 'fence', token, 'req', req,
      'waited', '1', 'seen', '1', 'queued', next, 'since', next_since)
    redis.call('HDEL', key, 'handover', 'for', 'next', 'nsince')
    return
  end
  if asking > 0 then
    redis.call('HSET', key, 'flag', identity, 'count', '1', 'fence', token, 'req', req, 'waited', '1')
  else
    redis.call('HSET', key, 'flag', identity, 'count', '1', 'fence', token, 'req', req)
  end
  redis.call('HDEL', key, 'handover', 'for', 'since', 'next', 'nsince')
end

-- may_take(opened, kept_for, kept_since, asking, identity): whether caller
-- `identity`, `asking`, may take a lock whose window opened at `opened`
-- (server µs) and is kept for `kept_for` (an identity, or false), who
-- began asking at `kept_since` (false: a window open to every earlier
-- caller from the start, as an older client's release opens it); and, when
-- it may not, whether that is because the window is still its waiter's
-- alone (see tell_kept_waiter).
local function may_take(opened, kept_for, kept_since, asking, identity)
  if asking < 0 then
    return true, false
  end
  if asking == 0 then
    return false, false
  end
  if kept_for == identity then
    return true, false
  end
  local open = tonumber(server_us()) - tonumber(opened)
  if kept_since and open < KEPT_ONLY_US then
    return false, true
  end
  return asking > open, false
end

-- tell_kept_waiter(baton, ttl): a waiter kept out of a window that is still
-- another waiter's alone makes sure that waiter hears of it. Each process's
-- waiter is woken by the release's announcement, but only one token is
-- pushed, and the process whose look pops it may not be the kept waiter's:
-- the kept waiter, its look finding nothing, would park on, and the others
-- would wait out the window's first part for nobody. So a token goes back
-- on an empty list (announced again), and the kept waiter's process looks
-- again. Only a waiter's attempt just after a park names its baton, so
-- each of them pushes at most once per park; a waiter kept out parks
-- through the window with its hub leaving the token on the list (the
-- client's `ParkHow::after_change`), so that its own park's look does not
-- pop what it just put back.
local function tell_kept_waiter(baton, ttl)
  if redis.call('LLEN', baton) == 0 then
    push_baton(baton, ttl)
  end
end

-- The hand-over window. A release that frees a lock a waiter found in its
-- way (the `queued` mark: an attempt of a caller that had already waited met
-- this ownership) wakes one parked waiter with its baton, and that waiter
-- needs a few round trips to come (an announcement, a pop, an attempt). A
-- thread that releases and asks again at once needs one, so without a window
-- it would take the lock back every time and the waiters of other clients
-- would starve. For `ms` after such a release the lock key holds only
-- `handover` (no `flag`: nobody holds it), the server time (µs) the window
-- opened. A caller that has been asking since before then takes it as a
-- free lock; by causality, a call that began after its thread saw the
-- release reply has asked for less time than the window has been open when
-- its attempt arrives. A caller that started asking later (a newcomer, or a
-- thread that queued behind its own process's waiters after the release) is
-- told what is left of the window ({0, pttl, -1}) and sleeps without
-- parking (so as not to pop the baton meant for the waiter), looking again
-- within that time (see FIRST_WINDOW_LOOK in src/parking/mod.rs).
--
-- That comparison is of the caller's clock when it sent its attempt with
-- the server's when it runs, so it is off by the attempt's way there: a
-- waiter that began asking shortly before the release, whose attempt is
-- held up (a loaded machine, a slow network), would be taken for a
-- newcomer and wait the window out, with every waiter of its process
-- behind it. So the window is kept for the waiter that last found the
-- ownership in its way too (`queued` holds its identity, `for` the
-- window's), which takes it whatever its clock says. A
-- `try_lock`, which would not wait, takes the lock in its window. A woken
-- waiter that never comes (its process died, or its wait ended) costs the
-- others at most the window. A first attempt or a `try_lock` that finds the
-- lock held does not mark it `queued`: a lock nobody has parked for is free
-- at its release.
--
-- The scripts tell callers apart by one number, `asking`: -1 a try_lock, 0
-- a first attempt, else the microseconds the caller has been asking.

-- server_us(): the server's time in microseconds, as an exact decimal
-- string (a Lua number this large would be written with 14 digits).
local function server_us()
  local now = redis.call('TIME')
  return now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
end

-- hand_over(key, ms, waiter): after the lock key was deleted, opens the
-- window ("0": none), kept for `waiter` (the identity in `queued`) and for
-- callers that asked before it opened.
local function hand_over(key, ms, waiter)
  if ms ~= '0' then
    redis.call('HSET', key, 'handover', server_us(), 'for', waiter)
    redis.call('PEXPIRE', key, ms)
  end
end

-- may_take(opened, kept_for, asking, identity): whether caller `identity`,
-- `asking`, may take a lock whose window opened at `opened` (server µs) and
-- is kept for `kept_for` (an identity, or false).
local function may_take(opened, kept_for, asking, identity)
  if asking < 0 then
    return true
  end
  if asking == 0 then
    return false
  end
  return kept_for == identity or asking > tonumber(server_us()) - tonumber(opened)
end

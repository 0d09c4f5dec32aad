-- Helpers of the semaphore's scripts (semaphore/*.lua), prepended to each.
--
-- Every semaphore script but renew.lua takes the same six keys, in this
-- order (all under one hash tag, so they share a cluster slot; adjust.lua
-- takes a seventh, its recent request ids):
--
-- KEYS[1]  state    (hash: total = permits in force, used = permits held by
--                    live holders, passes = tokens passed on by waiters that
--                    could not use them since the last release, reserved =
--                    the place of the waiter that holds newcomers back and
--                    reserved_end = when that ends unless it comes back,
--                    server ms, if any (see reservation); no TTL)
-- KEYS[2]  holders  (sorted set: permit id -> end of its lease, server ms)
-- KEYS[3]  counts   (hash: permit id -> how many permits it holds)
-- KEYS[4]  waiters  (sorted set: "<k>:<waiter identity>" -> end of its
--                    place, server ms; TTL: its longest place)
-- KEYS[5]  baton    (list of "ok" tokens, one per waiter that may be served
--                    now; TTL: the baton TTL)
-- KEYS[6]  reserved baton (list: one "ok" token for the waiter that holds
--                    newcomers back, pushed when the permits it needs are
--                    free; only that waiter parks on it; TTL: the baton TTL)
--
-- acquire.lua and release.lua take a seventh where the deployment allows
-- grants (see wake):
--
-- KEYS[7]  grant specs (hash: a waiter's place -> "<request> <grant lease
--                    ms> <b|r>", written by its last attempt: the request
--                    its park follows, how long a grant of its permits
--                    lasts before its client's watchdog lengthens it, and
--                    the list it parks on, the baton or the reserved one;
--                    TTL: as the waiters')
--
-- Time is the server's TIME, never the client's: no ARGV holds a timestamp.
-- holders and counts have no TTL: a holder whose lease ended is removed, and
-- its permits taken off `used` (once), by the next script that runs, so the
-- three always agree.

-- int(x): a whole number as Redis should store it (never in exponent form).
-- '%d', not '%.0f' or tostring: formatting a float costs a script more than
-- some Redis calls do, and every number here is whole (and far below 2^63).
local function int(x)
  return string.format('%d', x)
end

-- How many tokens per live waiter failed callers may pass on between two
-- releases (see wake).
local PASS_ROUNDS = 3

-- The type each of the six keys holds.
local SEM_KINDS = {'hash', 'zset', 'hash', 'zset', 'list', 'list'}

-- sem_wrong(i, kind): the error reply for KEYS[i], which holds a `kind`
-- (read here when nil) instead of its own type.
local function sem_wrong(i, kind)
  kind = kind or redis.call('TYPE', KEYS[i])['ok']
  return redis.error_reply('WRONGTYPE semaphore key ' .. KEYS[i] .. ' holds a ' .. kind .. ', not a ' .. SEM_KINDS[i])
end

-- sem_type_error(): an error reply when one of the five keys holds another
-- type, else nil. Checked before a script's first write: a script error is
-- not rolled back. (acquire.lua and release.lua read every key before their
-- first write instead, see sem_look: a TYPE is a call of its own.)
local function sem_type_error()
  for i, want in ipairs(SEM_KINDS) do
    local kind = redis.call('TYPE', KEYS[i])['ok']
    if kind ~= want and kind ~= 'none' then
      return sem_wrong(i, kind)
    end
  end
  return nil
end

-- sem_read(i, command, ...): the reply of a read of KEYS[i]; or nil and an
-- error reply: sem_wrong's when the key holds another type (the read itself
-- fails with WRONGTYPE, so no TYPE is needed while all is well), else the
-- command's error (an ACL refusal) naming the command and the key, which
-- Redis does not do for a call inside a script.
local function sem_read(i, command, ...)
  local reply = redis.pcall(command, KEYS[i], ...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, '^WRONGTYPE') then
      return nil, sem_wrong(i)
    end
    return nil, redis.error_reply(reply.err .. ' (' .. command .. ' on ' .. KEYS[i] .. ')')
  end
  return reply
end

-- server_ms(): the server's clock in milliseconds.
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- a_count(x): whether x is a whole number a semaphore can hold.
local function a_count(x)
  return x ~= nil and x >= 0 and x <= 1e15 and x == math.floor(x)
end

-- read_state(stored): the state as a table {total, used, passes, reserved,
-- reserved_end} (reserved: a place, or false); or nil and the
-- reply to return: {-1} when no total was ever set, {-3, field} when the
-- state is damaged (field 1: total, 2: used). `stored`: the state's fields
-- as sem_look read them; read here when nil.
local function read_state(stored)
  stored = stored or redis.call('HMGET', KEYS[1], 'total', 'used', 'passes', 'reserved', 'reserved_end')
  if not stored[1] and not stored[2] then
    return nil, {-1}
  end
  local total = tonumber(stored[1])
  if not a_count(total) then
    return nil, {-3, 1}
  end
  local used = tonumber(stored[2] or '0')
  if not a_count(used) then
    return nil, {-3, 2}
  end
  local passes = tonumber(stored[3] or '0')
  local passes_text = stored[3]
  if not a_count(passes) then
    passes, passes_text = 0, nil
  end
  return {
    total = total, used = used, passes = passes,
    reserved = stored[4], reserved_end = tonumber(stored[5] or '0') or 0, had_reserved = stored[4],
    -- What was read, as numbers and as stored: save writes back the text
    -- of a field that did not change instead of formatting it again.
    was = {total = total, used = used, passes = passes},
    text = {total = stored[1], used = stored[2], passes = passes_text},
  }
end

-- as_stored(st, field): st[field] as save writes it: as it was read (by
-- read_state; set.lua makes its own st) when it
-- did not change.
local function as_stored(st, field)
  if st.was and st[field] == st.was[field] and st.text[field] then
    return st.text[field]
  end
  return int(st[field])
end

-- save(st): writes the state back.
local function save(st)
  if st.reserved then
    redis.call('HSET', KEYS[1], 'total', as_stored(st, 'total'), 'used', as_stored(st, 'used'),
      'passes', as_stored(st, 'passes'), 'reserved', st.reserved, 'reserved_end', int(st.reserved_end))
  else
    redis.call('HSET', KEYS[1], 'total', as_stored(st, 'total'), 'used', as_stored(st, 'used'),
      'passes', as_stored(st, 'passes'))
    if st.had_reserved then
      redis.call('HDEL', KEYS[1], 'reserved', 'reserved_end')
    end
  end
end

-- reservation(st, now): the place of the waiter that holds newcomers back,
-- and its k; nil when there is none. A waiter that has waited long (the
-- client says so, see acquire.lua) reserves its k: until it is served, or
-- its place ends or is given up, nobody else takes permits that would leave
-- fewer than its k for it. Without it a waiter for many permits starves
-- while others keep taking one or two. A reservation ends unless its waiter
-- comes back in time (reserved_end, pushed on at each of its attempts, so
-- that a waiter that died holds nobody back for long); one that has ended,
-- whose place has left the waiters, or whose k is over the total, is
-- dropped here (and from the state at the next save).
local function reservation(st, now)
  local place = st.reserved
  if not place then
    return nil
  end
  local ends = redis.call('ZSCORE', KEYS[4], place)
  local k = tonumber(string.match(place, '^(%d+):'))
  if ends and tonumber(ends) > now and st.reserved_end > now and k and k <= st.total then
    return place, k
  end
  st.reserved = false
  return nil
end

-- purge(st, now, expired): removes the holders whose lease ended by `now`
-- and takes their permits off st.used, once each (a holder is counted only
-- while it is in the holders set). `expired`: the first of them, as sem_look
-- read them (read here when nil). Returns how many holders were removed.
local function purge(st, now, expired)
  local removed = 0
  while true do
    expired = expired or redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now), 'LIMIT', '0', '256')
    if #expired == 0 then
      break
    end
    local counts = redis.call('HMGET', KEYS[3], unpack(expired))
    for _, k in ipairs(counts) do
      st.used = st.used - (tonumber(k) or 0)
    end
    redis.call('HDEL', KEYS[3], unpack(expired))
    redis.call('ZREM', KEYS[2], unpack(expired))
    removed = removed + #expired
    if #expired < 256 then
      -- That was all of them: no need to look again.
      break
    end
    expired = nil
  end
  if st.used < 0 then
    st.used = 0
  end
  return removed
end

-- sem_look(id, now): the reads acquire.lua and release.lua make before
-- their first write, one of each key, in key order: the state's fields
-- (stored), the first holders whose lease ended (expired, for purge), the
-- permits `id` holds (held: a string, or false), the waiters' places with
-- their ends (waiters, for wake), while somebody waits the baton's tokens
-- (tokens; nil otherwise) and, while a waiter holds newcomers back, the
-- reserved baton's (reserved_tokens: only wake pushes it, and only then;
-- nil otherwise). Or nil and the error reply for the first key that holds
-- another type: every key the call may write is read, so that error comes
-- before anything changed, with no TYPE call while all is well.
local function sem_look(id, now)
  local look, err = {}, nil
  look.stored, err = sem_read(1, 'HMGET', 'total', 'used', 'passes', 'reserved', 'reserved_end')
  if err then
    return nil, err
  end
  look.expired, err = sem_read(2, 'ZRANGEBYSCORE', '-inf', int(now), 'LIMIT', '0', '256')
  if err then
    return nil, err
  end
  look.held, err = sem_read(3, 'HGET', id)
  if err then
    return nil, err
  end
  look.waiters, err = sem_read(4, 'ZRANGE', '0', '-1', 'WITHSCORES')
  if err then
    return nil, err
  end
  -- The baton only when somebody waits: wake pushes tokens for live
  -- waiters alone, so with none this call leaves the baton as it is (and
  -- a key of another type there fails only the calls that would use it).
  -- One Redis call less in every uncontended acquisition and release.
  if #look.waiters > 0 then
    look.tokens, err = sem_read(5, 'LLEN')
    if err then
      return nil, err
    end
  end
  if look.stored[4] then
    look.reserved_tokens, err = sem_read(6, 'LLEN')
    if err then
      return nil, err
    end
  end
  return look
end

-- leave_place(look, place): takes `place` off the waiters, when it is one
-- (sem_look read them: no call when it is not), and off look.waiters; and
-- its grant spec, where there are specs (KEYS[7]).
local function leave_place(look, place)
  if place == '' then
    return
  end
  for i = 1, #look.waiters, 2 do
    if look.waiters[i] == place then
      redis.call('ZREM', KEYS[4], place)
      if KEYS[7] then
        redis.call('HDEL', KEYS[7], place)
      end
      table.remove(look.waiters, i)
      table.remove(look.waiters, i)
      return
    end
  end
end

-- wake(st, now, ttl, failed): makes the baton list hold one token per waiter
-- that may be served now, and never more tokens than live waiters. Counted
-- the reserving waiter first (its k is set aside whether or not it fits
-- now), then in place order (earliest place end first): each waiter whose k
-- fits in the permits still uncounted, and each whose k is over the total
-- (its next attempt reports that). A waiter that cannot get its k is not
-- woken for nothing. The reserving waiter's token goes on its own list
-- (KEYS[6]), when its k fits: which parked client pops a shared token is
-- not known (each pops on the server's announcement of the push, the
-- fastest first), and a waiter of one that cannot use it would pass it on,
-- while others kept popping it first, until the passes ran out.
--
-- `failed`: false, or the place of a caller that could not get its permits
-- ('' for one that does not wait), which may have taken a token meant for
-- another waiter (tokens go to whoever pops first). It passes the token on
-- (its client parks without taking back what is on the list, see
-- ParkHow::after_change), but at most PASS_ROUNDS tokens per other live
-- waiter in all until the next release, acquisition or expiry resets
-- st.passes: a token never circles for long between waiters that cannot
-- use it while the place of a waiter that has gone still counts. More than
-- one per waiter: a token passed on may be popped first by another waiter
-- that cannot use it either, and passed on again.
--
-- `waiters`, `tokens` and `reserved_tokens`: the waiters' places with their
-- ends (as ZRANGE WITHSCORES gives them) and the lengths of the baton and
-- of the reserved baton, when the caller has them (sem_look) and changed
-- none since; read here when nil.
--
-- `grant`: nil, or (a release's, where the deployment allows grants) a
-- function(member, k) that grants the waiter at place `member` its k
-- permits and tells its client, when it can (see release.lua); whether it
-- did. Each waiter a token would be pushed for (the reserving one on its
-- own list) is offered a grant first; a granted one needs no token, and
-- its permits are used.
--
-- Returns how many tokens were pushed on the shared baton.
local function wake(st, now, ttl, failed, waiters, tokens, reserved_tokens, grant)
  waiters = waiters or redis.call('ZRANGE', KEYS[4], '0', '-1', 'WITHSCORES')
  local members, ended = {}, false
  for i = 1, #waiters, 2 do
    if tonumber(waiters[i + 1]) > now then
      members[#members + 1] = waiters[i]
    else
      ended = true
    end
  end
  if ended then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  end
  local left = math.max(0, st.total - st.used)
  local wanted = 0
  local first, first_k = reservation(st, now)
  -- The live waiters that park on the shared baton, but a failed caller.
  local sharing = #members
  if first then
    if first_k <= left and (reserved_tokens or redis.call('LLEN', KEYS[6])) == 0 then
      if grant and grant(first, first_k) then
        -- Served: it holds newcomers back no more.
        st.reserved = false
      else
        redis.call('RPUSH', KEYS[6], 'ok')
        redis.call('PEXPIRE', KEYS[6], ttl)
      end
    end
    left = math.max(0, left - first_k)
  end
  for _, member in ipairs(members) do
    local k = tonumber(string.match(member, '^(%d+):'))
    if member == first or member == failed then
      -- Woken on its own list (above), or the caller that passes tokens
      -- on: none for it.
      sharing = sharing - 1
    end
    if member == first then
      -- counted above
    elseif k and k > st.total then
      wanted = wanted + 1
    elseif k and k <= left then
      if not (grant and grant(member, k)) then
        wanted = wanted + 1
      end
      left = left - k
    end
  end
  -- A caller that failed may have popped the token of a waiter it does not
  -- know, and a token it passes on goes to whichever other client pops
  -- first: passed on one at a time, the passes could run out before it
  -- reached the waiter that can use it. So a failed caller gives every
  -- other live waiter one.
  if failed and wanted > 0 then
    wanted = math.max(wanted, sharing)
  end
  if wanted == 0 then
    -- Nothing to push, whatever the baton holds.
    return 0
  end
  local push = wanted - (tokens or redis.call('LLEN', KEYS[5]))
  if failed then
    push = math.min(push, PASS_ROUNDS * sharing - st.passes)
  end
  if push <= 0 then
    return 0
  end
  for _ = 1, push do
    redis.call('RPUSH', KEYS[5], 'ok')
  end
  redis.call('PEXPIRE', KEYS[5], ttl)
  if failed then
    st.passes = st.passes + push
  end
  return push
end

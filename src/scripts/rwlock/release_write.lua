-- release_write: release one write guard; the last one frees the write
-- hold and wakes who waits for it.
--
-- KEYS[1]  write key       (hash: flag, count, fence, req, rwait, uwait)
-- KEYS[2]  readers key     (sorted set: identity -> lease end, server ms)
-- KEYS[3]  depths key      (hash: identity -> "<depth>:<token>")
-- KEYS[4]  writers key     (sorted set: waiting writer -> place end)
-- KEYS[5]  read baton key  (list)
-- KEYS[6]  write baton key (list)
-- KEYS[7]  upgradable key  (hash: flag, ...; only its existence is read)
-- KEYS[8]  upgradable baton key (list)
-- ARGV[1]  identity of the caller
-- ARGV[2]  fencing token of the caller's write hold
-- ARGV[3]  the caller's live write guards after this release (0: the last)
-- ARGV[4]  the hold's lease in milliseconds: an inner release makes it live
--          at least this long
-- ARGV[5]  baton TTL in milliseconds
-- KEYS[9]  with ARGV[6]: the read grant specs (see read.lua)
-- ARGV[6]  where the deployment allows grants (one server, Sentinel's
--          master without replica acknowledgements): the prefix of the
--          clients' grant channels; else absent
-- KEYS[10], KEYS[11], ARGV[7]  with ARGV[6]: the write grant specs (see
--          write.lua), the fence key and its TTL in ms, for a grant of the
--          write hold to a waiting writer (lib/write_grant.lua); else
--          absent
--
-- Returns -1     the caller does not hold the write lock (its lease ran out);
--                nothing was changed
--         depth  > 0: an inner guard was released
--         0      the write hold was freed: a read baton was pushed if a
--                reader was refused meanwhile (`rwait`), an upgradable
--                baton if an upgradable reader was (`uwait`), and a write
--                baton if writers wait and no reader or upgradable reader
--                holds (a writer that downgraded may still read, one that
--                upgraded still holds the upgradable read; their last
--                release wakes the writer then)
--
-- The grant (ARGV[6]): where a fresh reader would be let in now (no writer
-- waits, no upgrade's mark), each waiter whose refusal by this hold left a
-- grant spec is granted the read its request asked for, when its client
-- hears the message (lib/grant_message.lua: token the request, the hold's
-- lease end passed along, which a give-back names): the hold is written
-- as read.lua writes a fresh one, for the grant's lease. The specs go. A
-- read baton is pushed only for refusals that left no spec (`rplain`) or a
-- grant nobody heard; where no grant is made, for any refusal (`rwait`),
-- as before. A waiter granted the read wakes holding it; one that is gone
-- holds writers back for the grant's lease (2 s at most). Where writers
-- wait instead, and no reader or upgradable reader holds, the first of
-- them is granted the write hold when it left a spec (KEYS[10]), and
-- woken by the write baton when not.
--
-- The depth is set from ARGV, so the same release sent twice takes off one
-- level. now_ms, purge, any_live, expire_with (lib/rw.lua), extend_lease,
-- baton_error, push_baton, next_fence, publish_grant, first_writer and
-- grant_writer (lib/) are prepended.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'rwait', 'uwait', 'rplain')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end

local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[1], 'count', depth)
  extend_lease(KEYS[1], ARGV[4])
  return depth
end

local now = now_ms()
-- The first waiting writer, the one a write grant goes to.
local first = first_writer(KEYS[4], now)
local writers_wait = first ~= nil
-- The waiters to grant the read to: only where a fresh reader would be let
-- in (read.lua), as the specs' waiters would be if they asked now.
local specs = {}
if ARGV[6] and KEYS[9] and not writers_wait then
  local upgrading = redis.call('HGET', KEYS[7], 'upgrading')
  if not (upgrading and tonumber(upgrading) > now) then
    specs = redis.call('HGETALL', KEYS[9])
  end
end
-- Whether a read baton goes: for the refused readers no grant reaches.
local wakes_readers = held[5] or (held[3] and #specs == 0)
-- The batons this release may push, decided before its first write: only
-- those are checked (a TYPE each), so that a damaged one fails the call with
-- nothing changed, and a release that wakes nobody checks none.
local batons = {}
if wakes_readers or #specs > 0 then
  batons[#batons + 1] = KEYS[5]
end
if held[4] then
  batons[#batons + 1] = KEYS[8]
end
local wakes_writer = writers_wait and not any_live(KEYS[2], now)
    and redis.call('EXISTS', KEYS[7]) == 0
if wakes_writer then
  batons[#batons + 1] = KEYS[6]
end
for _, baton in ipairs(batons) do
  local err = baton_error(baton)
  if err then
    return err
  end
end
purge(KEYS[2], KEYS[3], KEYS[4], now)
redis.call('DEL', KEYS[1])
if #specs > 0 then
  for i = 1, #specs, 2 do
    local waiter = specs[i]
    local req, lease = string.match(specs[i + 1], '^(%d+) ([1-9]%d*)$')
    -- A waiter that holds a read already (it got in another way) is not
    -- granted another over it.
    if req and redis.call('HEXISTS', KEYS[3], waiter) == 0 then
      local ends = ms_score(now, lease)
      if publish_grant(ARGV[6], waiter, req, req, ends, KEYS[1], KEYS[5]) then
        redis.call('ZADD', KEYS[2], ends, waiter)
        redis.call('HSET', KEYS[3], waiter, '1:' .. req)
      else
        wakes_readers = true
      end
    end
  end
  redis.call('DEL', KEYS[9])
  expire_with(KEYS[2], KEYS[3], now)
end
if wakes_readers then
  push_baton(KEYS[5], ARGV[5])
end
if wakes_writer and not (ARGV[7] and grant_writer(first, KEYS[4], KEYS[10], KEYS[1], KEYS[11],
    ARGV[7], ARGV[6], KEYS[6], now)) then
  push_baton(KEYS[6], ARGV[5])
end
if held[4] then
  push_baton(KEYS[8], ARGV[5])
end
return 0

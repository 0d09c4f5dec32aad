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
-- The depth is set from ARGV, so the same release sent twice takes off one
-- level. now_ms, purge, any_live (lib/rw.lua), extend_lease, baton_error and
-- push_baton (lib/) are prepended.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'rwait', 'uwait')
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
-- The batons this release pushes, decided before its first write: only
-- those are checked (a TYPE each), so that a damaged one fails the call with
-- nothing changed, and a release that wakes nobody checks none.
local batons = {}
if held[3] then
  batons[#batons + 1] = KEYS[5]
end
if held[4] then
  batons[#batons + 1] = KEYS[8]
end
if any_live(KEYS[4], now) and not any_live(KEYS[2], now)
    and redis.call('EXISTS', KEYS[7]) == 0 then
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
for _, baton in ipairs(batons) do
  push_baton(baton, ARGV[5])
end
return 0

-- release_upgradable: release one upgradable guard; the last one ends the
-- upgradable hold and wakes who waits for it.
--
-- KEYS[1]  upgradable key      (hash: flag, count, fence = token, req,
--                               upgrading, rwait, uwait)
-- KEYS[2]  write key           (hash: flag, ...; only its existence is read)
-- KEYS[3]  readers key         (sorted set: identity -> lease end, server ms)
-- KEYS[4]  depths key          (hash: identity -> "<depth>:<token>")
-- KEYS[5]  writers key         (sorted set: waiting writer -> place end)
-- KEYS[6]  read baton key      (list)
-- KEYS[7]  write baton key     (list)
-- KEYS[8]  upgradable baton key (list)
-- ARGV[1]  identity of the caller
-- ARGV[2]  token of the caller's upgradable hold
-- ARGV[3]  the caller's live upgradable guards after this release (0: the
--          last)
-- ARGV[4]  the hold's lease in milliseconds: an inner release makes it live
--          at least this long
-- ARGV[5]  baton TTL in milliseconds
-- KEYS[9], KEYS[10], ARGV[6], ARGV[7]  where the deployment allows grants
--          (see release_write.lua): the write grant specs (see write.lua),
--          the fence key, the prefix of the clients' grant channels and
--          the fence's TTL in ms; else absent. Where it would push the
--          write baton, the release then grants the write hold to the first
--          waiting writer when it left a spec (lib/write_grant.lua).
--
-- Returns -1     the caller holds no upgradable read under that token (its
--                lease ran out); nothing was changed
--         depth  > 0: an inner guard was released
--         0      the hold ended: an upgradable baton was pushed if another
--                upgradable reader was refused meanwhile (`uwait`), a read
--                baton if a reader was refused by an upgrade's mark
--                (`rwait`), and a write baton if writers wait, no reader
--                holds and no writer holds (the holder may have upgraded
--                and still write; its write release wakes them then)
--
-- The depth is set from ARGV, so the same release sent twice takes off one
-- level. now_ms, purge (lib/rw.lua), extend_lease, baton_error,
-- push_baton, next_fence, publish_grant, first_writer and grant_writer
-- (lib/) are prepended.
local up = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'uwait', 'rwait')
if up[1] ~= ARGV[1] or up[2] ~= ARGV[2] then
  return -1
end

local depth = tonumber(ARGV[3])
if depth > 0 then
  redis.call('HSET', KEYS[1], 'count', depth)
  extend_lease(KEYS[1], ARGV[4])
  return depth
end

for _, baton in ipairs({KEYS[6], KEYS[7], KEYS[8]}) do
  local err = baton_error(baton)
  if err then
    return err
  end
end
local now = now_ms()
purge(KEYS[3], KEYS[4], KEYS[5], now)
redis.call('DEL', KEYS[1])
if up[3] then
  push_baton(KEYS[8], ARGV[5])
end
if up[4] then
  push_baton(KEYS[6], ARGV[5])
end
if redis.call('ZCARD', KEYS[5]) > 0 and redis.call('ZCARD', KEYS[3]) == 0
    and redis.call('EXISTS', KEYS[2]) == 0
    and not (ARGV[7] and grant_writer(first_writer(KEYS[5], now), KEYS[5], KEYS[9], KEYS[2],
      KEYS[10], ARGV[7], ARGV[6], KEYS[7], now)) then
  push_baton(KEYS[7], ARGV[5])
end
return 0

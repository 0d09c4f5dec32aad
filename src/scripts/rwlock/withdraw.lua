-- withdraw: a waiting writer that gives up (its deadline passed, or its
-- wait failed) leaves its place, so that readers stop queueing behind it
-- now rather than when the place would end; when it was the last waiting
-- writer, a read baton and an upgradable baton wake the readers it held
-- back. Best effort: a place left behind ends by itself.
--
-- KEYS[1]  writers key    (sorted set: waiting writer -> place end)
-- KEYS[2]  read baton key (list)
-- KEYS[3]  upgradable baton key (list)
-- KEYS[4]  write grant specs (hash, see write.lua): the writer's goes too
-- ARGV[1]  identity of the writer
-- ARGV[2]  baton TTL in milliseconds
--
-- Returns 1 when the place was there and removed, 0 when it was not.
-- now_ms, expire_with (lib/rw.lua), baton_error and push_baton (lib/) are
-- prepended.
for _, baton in ipairs({KEYS[2], KEYS[3]}) do
  local err = baton_error(baton)
  if err then
    return err
  end
end
local now = now_ms()
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  push_baton(KEYS[2], ARGV[2])
  push_baton(KEYS[3], ARGV[2])
else
  expire_with(KEYS[1], nil, now)
end
return 1

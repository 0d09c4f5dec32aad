-- cancel_upgrade: an upgradable reader that gives up waiting to upgrade
-- (its deadline passed, or its wait failed) takes its mark off, so that
-- fresh readers stop waiting behind it now rather than when the mark would
-- end, and wakes the readers the mark refused. It keeps its upgradable
-- read. Best effort: a mark left behind ends by itself.
--
-- KEYS[1]  upgradable key (hash: flag, fence = token, upgrading, rwait, ...)
-- KEYS[2]  read baton key (list)
-- ARGV[1]  identity of the upgradable reader
-- ARGV[2]  token of its upgradable hold
-- ARGV[3]  baton TTL in milliseconds
--
-- Returns 1 when its mark was there and removed, 0 when it was not.
-- baton_error and push_baton (lib/baton.lua) are prepended.
local up = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'upgrading', 'rwait')
local err = baton_error(KEYS[2])
if err then
  return err
end
if up[1] ~= ARGV[1] or up[2] ~= ARGV[2] or not up[3] then
  return 0
end
redis.call('HDEL', KEYS[1], 'upgrading', 'rwait')
if up[4] then
  push_baton(KEYS[2], ARGV[3])
end
return 1

-- adopt_fence: the second round of a quorum acquisition (Redlock). Each
-- master issued its own token; the client takes T = the highest of the
-- granting majority + 1 and proposes it to every master. A master accepts
-- T only if its counter is below T; T is used only if a majority accepted
-- it, so two proposals of one T can never both win, and a later holder,
-- whose majority meets this one in at least one master, gets a higher T.
--
-- KEYS[1]  lock key   (hash: flag, count, fence, ...)
-- KEYS[2]  fence key  (the master's counter)
-- ARGV[1]  identity of the new holder
-- ARGV[2]  the proposed token T
-- ARGV[3]  the counter's TTL in milliseconds
--
-- Where the identity holds the lock, its stored token becomes T, so that
-- renewals and releases (which check the token) agree on every master.
-- Returns 1 when T was accepted here, 0 when the counter was already at or
-- above T.
local t = tonumber(ARGV[2])
-- HMGET, as every lock script reads the hash: the lock's ACL line has no
-- HGET (docs/security.md).
if redis.call('HMGET', KEYS[1], 'flag')[1] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'fence', ARGV[2])
end
local stored = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if stored < t then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0

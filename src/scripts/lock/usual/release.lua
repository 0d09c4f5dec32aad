-- release's usual path, first in the script (see lock/release.lua for its
-- KEYS, ARGV and replies): the owner check, and the last release of an
-- ownership nobody asked for meanwhile, which deletes the lock and wakes
-- nobody. It returns before the helpers the other paths need are defined
-- (each a closure made anew on every call), so that the uncontended cycle
-- pays for none of them.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'waited', 'queued', 'since', 'grant')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end
if ARGV[3] == '0' and not held[3] then
  redis.call('DEL', KEYS[1])
  return 0
end

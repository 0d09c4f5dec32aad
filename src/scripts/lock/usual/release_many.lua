-- release_many's usual call, first in the script (see
-- lock/release_many.lua for its KEYS, ARGV and replies): a quorum's last
-- release of one name that nobody asked for meanwhile, which deletes the
-- lock and wakes nobody. It returns before the helpers the other paths
-- need are defined (each a closure made anew on every call), so that the
-- uncontended cycle pays for none of them. `first` is the first name's
-- lock as read here, which the loop below does not read again.
local first = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'waited', 'queued', 'since')
if #KEYS == 2 and ARGV[5] == '0' and first[1] == ARGV[3] and first[2] == ARGV[4] and not first[3] then
  redis.call('DEL', KEYS[1])
  return {0}
end

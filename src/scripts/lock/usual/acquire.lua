-- acquire's usual path, first in the script (see lock/acquire.lua for its
-- KEYS, ARGV and replies): a lock free outside any hand-over window, taken
-- afresh. It returns before the helpers the other paths need are defined
-- (each a closure made anew on every call), so that the uncontended cycle
-- pays for none of them. next_fence comes from lib/, prepended.
local held = redis.call('HMGET', KEYS[1], 'flag', 'fence', 'handover', 'for', 'since', 'next', 'nsince', 'queued')
if not held[3] and (not held[1] or (held[1] == ARGV[1] and held[2] ~= ARGV[3] and ARGV[10] ~= '1')) then
  if ARGV[11] == '1' then
    redis.call('LPOP', KEYS[3])
  end
  local fence, err, token = next_fence(KEYS[2], ARGV[5], ARGV[8], ARGV[9])
  if err then
    return err
  end
  -- ARGV[7] is "-1", "0" or a positive number: compared as strings, which
  -- costs the script less than a tonumber.
  if ARGV[7] == '0' or ARGV[7] == '-1' then
    redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', '1', 'fence', token, 'req', ARGV[6])
  else
    redis.call('HSET', KEYS[1], 'flag', ARGV[1], 'count', '1', 'fence', token, 'req', ARGV[6], 'waited', '1')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence, 1}
end

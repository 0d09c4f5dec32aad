-- baton_error(key): an error reply when the baton key holds something other
-- than a list, else nil. Checked before a script's first write: a script
-- error is not rolled back, and a lock deleted without its baton would leave
-- waiters parked until their maximum park time.
local function baton_error(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'list' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE baton key ' .. key .. ' holds a ' .. kind .. ', not a list')
  end
  return nil
end

-- push_baton(key, ttl): leave one token for one waiter. A second token
-- would only cost a wasted retry; the TTL keeps an unclaimed one from
-- leaking.
local function push_baton(key, ttl)
  redis.call('RPUSH', key, 'ok')
  redis.call('LTRIM', key, 0, 0)
  redis.call('PEXPIRE', key, ttl)
end


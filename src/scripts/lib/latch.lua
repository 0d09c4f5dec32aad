-- Helpers of the latch's scripts, prepended to each.
--
-- A latch keeps its count (KEYS[1], a string; absent = 0 = open) and the id
-- of its round (KEYS[2], a string: set by the set_count that started the
-- round, kept with a TTL once the round ended). The round id is what makes
-- re-arming safe: a waiter of round r is done once the count is 0 or the
-- round is no longer r; a count-down meant for round r counts only in
-- round r; and each round wakes its waiters on a baton key of its own.

-- latch_state(count_key, round_key): the count (0 when absent: open) and
-- the round id ('' when none), or nil, nil and an error reply when a key
-- holds something else.
local function latch_state(count_key, round_key)
  local current = redis.call('GET', count_key)
  local count = 0
  if current then
    count = tonumber(current)
    if count == nil then
      return nil, nil, redis.error_reply('WRONGTYPE latch key ' .. count_key .. ' holds a value that is not a count')
    end
  end
  local round = redis.pcall('GET', round_key)
  if type(round) == 'table' and round.err then
    return nil, nil, redis.error_reply('WRONGTYPE latch key ' .. round_key .. ' holds a value that is not a round id')
  end
  return count, round or ''
end

-- pass_token(baton_key, ttl): leaves one token on a round's baton list, for
-- the next parked waiter of that round.
local function pass_token(baton_key, ttl)
  redis.call('RPUSH', baton_key, 'open')
  redis.call('LTRIM', baton_key, 0, 0)
  redis.call('PEXPIRE', baton_key, ttl)
end

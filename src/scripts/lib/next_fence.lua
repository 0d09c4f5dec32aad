-- below(a, b): whether the string of digits `a` is below `b` as numbers
-- (strings of digits of one length compare as their numbers do).
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end

-- next_fence(key, ttl, proposed, reserve, now): the next fencing token of a
-- lock (for the reply: a number, or its digits as a string; nil; and the
-- digits to store), or nil and an error reply. Prepended to the scripts that start an ownership. `now` is the
-- server's TIME reply if the caller has one (a script taking several
-- names reads the clock once), else nil.
--
-- `proposed` (a string, or nil: none) is a Redlock client's proposal: the
-- token is never below it either, so that when every master of a majority
-- answers exactly the proposal, that majority's counters all hold it and
-- the quorum needs no second round to agree on a token (see
-- adopt_fence.lua for the general case). Like the clock, it is written
-- with the one `SET ... GET`; only a counter at or above it (a master
-- ahead of the proposal) costs a second `SET`.
--
-- `reserve` (a string of digits, or nil: "0") sets aside the tokens above
-- this one for the ownership's holders inside one process: threads that
-- pass the ownership among themselves in memory number their holds token
-- + 1, token + 2, ... up to token + reserve, and the counter is left at
-- token + reserve, so that every later ownership's token is above them.
--
-- The token is max(stored counter + 1, server clock in microseconds), on
-- every issue. So tokens keep increasing even when Redis loses the counter
-- or rolls it back (a restart from an older RDB snapshot, an AOF that lost
-- its last second, a failover to a lagging replica): every token issued
-- before the rollback is below the clock by then, unless tokens were issued
-- faster than one per microsecond. For the same reason the counter may
-- expire after `ttl` ms without use: a new one starts from the clock.
--
-- Doubles hold integers exactly up to 2^53 (about 285 years of
-- microseconds), and the token is written back with '%.0f', never in
-- exponent form.
local function next_fence(key, ttl, proposed, reserve, now)
  now = now or redis.call('TIME')
  local micros = now[2]
  local clock = now[1] .. string.rep('0', 6 - #micros) .. micros
  local usual = proposed == nil or proposed == '0'
  local reserving = reserve and reserve ~= '0'
  -- The usual case in one call: the token the clock (or a proposal above
  -- it) gives, written as it is (a token's round trip through a double
  -- and '%.0f' costs this script more than any of its calls; a reserve is
  -- added to the microseconds alone, with the cheap '%d'), and the counter
  -- it replaces read back (SET's GET: one call where GET and SET were
  -- two). When that counter was absent or below it, that is the token.
  local first = clock
  if not usual and string.find(proposed, '^%d+$') and below(clock, proposed) then
    first = proposed
  end
  local stored
  if usual or not reserving then
    local counter = first
    if reserving then
      local ahead = tonumber(micros) + tonumber(reserve)
      if ahead < 1000000 then
        counter = now[1] .. string.format('%06d', ahead)
      else
        counter = string.format('%d%06d', tonumber(now[1]) + math.floor(ahead / 1000000), ahead % 1000000)
      end
    end
    stored = redis.call('SET', key, counter, 'PX', ttl, 'GET')
    if not stored or (string.find(stored, '^%d+$') and below(stored, first)) then
      -- The token as digits for the reply too (the script's reply sends
      -- it as a string of digits, which the client reads as a number):
      -- tonumber on sixteen digits is strtod's slow path.
      return first, nil, first
    end
  else
    stored = redis.call('GET', key)
  end
  local counter = 0
  if stored then
    counter = tonumber(stored)
    if not counter then
      if usual or not reserving then
        -- The damaged value goes back as it was (its TTL aside): an
        -- error changes nothing.
        redis.call('SET', key, stored, 'PX', ttl)
      end
      return nil, redis.error_reply('WRONGTYPE fence key ' .. key .. ' holds a value that is not an integer')
    end
  end
  local fence = math.max(counter + 1, tonumber(clock), tonumber(proposed or '0') or 0)
  local token = string.format('%.0f', fence)
  local last = token
  if reserving then
    last = string.format('%.0f', fence + tonumber(reserve))
  end
  redis.call('SET', key, last, 'PX', ttl)
  return fence, nil, token
end

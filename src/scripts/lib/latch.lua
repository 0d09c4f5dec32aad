-- latch_count(key): a latch's count (0 when absent: open), or nil and an
-- error reply when the key holds something that is not a count.
-- Prepended to the latch's scripts.
local function latch_count(key)
  local current = redis.call('GET', key)
  if not current then
    return 0
  end
  local count = tonumber(current)
  if count == nil then
    return nil, redis.error_reply('WRONGTYPE latch key ' .. key .. ' holds a value that is not a count')
  end
  return count
end

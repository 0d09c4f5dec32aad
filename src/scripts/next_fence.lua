-- next_fence(key): the next fencing token of a lock. Prepended to the
-- scripts that start an ownership (acquire.lua, handoff.lua).
--
-- A new or forgotten counter (Redis restarted empty) starts from the server
-- clock in microseconds, so tokens keep increasing across a loss of the
-- counter. Built as a string: Lua numbers would round it. INCR fails on a
-- non-integer before anything else is written.
local function next_fence(key)
  if redis.call('EXISTS', key) == 0 then
    local now = redis.call('TIME')
    redis.call('SET', key, now[1] .. string.format('%06d', tonumber(now[2])))
  end
  return redis.call('INCR', key)
end


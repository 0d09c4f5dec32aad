-- Take permits from a rate limiter's token bucket, on the server's clock.
--
-- KEYS[1]  the configuration hash: mode ("overall" | "per_client"),
--          permits (the capacity), per_us (the interval in microseconds)
-- KEYS[2]  the limiter's overall bucket (hash: tokens, ts)
-- KEYS[3]  the calling client's own bucket (hash: tokens, ts), used in
--          per_client mode
-- ARGV[1]  permits wanted; 0 only reads the bucket and writes nothing
--
-- Time is the server's TIME, never the client's: ARGV holds no timestamp.
-- A bucket fills at permits/per_us per microsecond up to the capacity; a
-- missing bucket is full. `ts` is the server time the tokens were counted at;
-- if the server clock goes back, nothing refills until it passes `ts` again.
--
-- Returns {status, a, b}:
--   { 1, left, 0 }            granted; `left` whole permits remain
--                             (for ARGV[1] = 0: the whole permits available)
--   { 0, have, wait_us }      refused, nothing changed; the permits wanted
--                             will exist in wait_us microseconds if no one
--                             else takes any
--   {-1, 0, 0}                no configuration (set_rate was never called)
--   {-2, capacity, 0}         more permits wanted than the bucket can hold
--   {-3, field, 0}            the configuration is damaged: field 1 (mode),
--                             2 (permits) or 3 (per_us) is missing or wrong
local config = redis.call('HMGET', KEYS[1], 'mode', 'permits', 'per_us')
if not config[1] and not config[2] and not config[3] then
  return {-1, 0, 0}
end
local capacity = tonumber(config[2])
local per_us = tonumber(config[3])
if not capacity or capacity < 1 then
  return {-3, 2, 0}
end
if not per_us or per_us < 1 then
  return {-3, 3, 0}
end
local bucket
if config[1] == 'overall' then
  bucket = KEYS[2]
elseif config[1] == 'per_client' then
  bucket = KEYS[3]
else
  return {-3, 1, 0}
end

local wanted = tonumber(ARGV[1])
if wanted > capacity then
  return {-2, capacity, 0}
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local state = redis.call('HMGET', bucket, 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if not tokens or not ts then
  tokens, ts = capacity, now
elseif now >= ts then
  local elapsed = now - ts
  if elapsed >= per_us then
    tokens = capacity
  else
    -- elapsed * capacity first: exact in doubles for every whole-number
    -- case, so a refill of exactly one permit is exactly 1.
    tokens = math.min(capacity, tokens + elapsed * capacity / per_us)
  end
  ts = now
else
  tokens = math.min(capacity, tokens)
end

if wanted == 0 then
  return {1, math.floor(tokens), 0}
end
if tokens >= wanted then
  tokens = tokens - wanted
  redis.call('HSET', bucket, 'tokens', tokens, 'ts', ts)
  -- Idle state expires once the bucket would be full again anyway (plus a
  -- second of margin): a missing bucket reads as full.
  local full_in_ms = math.ceil((capacity - tokens) * per_us / capacity / 1000)
  redis.call('PEXPIRE', bucket, full_in_ms + 1000)
  return {1, math.floor(tokens), 0}
end
local wait_us = math.ceil((wanted - tokens) * per_us / capacity) + (ts - now)
return {0, math.floor(tokens), wait_us}

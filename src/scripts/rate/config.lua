-- Store a rate limiter's configuration (set_rate and force_rate).
--
-- KEYS[1]  the limiter's configuration hash (no TTL)
-- ARGV[1]  mode: "overall" or "per_client"
-- ARGV[2]  permits per interval, which is also the bucket's capacity (>= 1)
-- ARGV[3]  the interval in microseconds (>= 1000)
-- ARGV[4]  "1": replace any configuration (force_rate);
--          "0": write only when there is none (set_rate)
--
-- Returns 1 when the configuration was written, 0 when one existed and was
-- left as it was. A key of another type is a WRONGTYPE error, never
-- overwritten. Buckets are not touched: the next acquire refills them at the
-- new rate and clips them to the new capacity.
if ARGV[4] ~= '1' and redis.call('HLEN', KEYS[1]) > 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'mode', ARGV[1], 'permits', ARGV[2], 'per_us', ARGV[3])
return 1

-- extend_lease(key, ms): make the key live at least `ms` more milliseconds,
-- never less than it already would. Only a release (or the lease running
-- out) ends an ownership early: re-entry, an inner release, a renewal and
-- extend() all go through here, so no handle of another lease mode can cut
-- a lease short. A key without expiry (someone ran PERSIST) is left as it is.
local function extend_lease(key, ms)
  local left = redis.call('PTTL', key)
  if left >= 0 and left < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end


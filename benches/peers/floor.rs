//! The floors the benches measure redbaton against, on one connection of
//! the caller's: the floor of any Redis lock (`SET key me NX PX`, then a
//! compare-and-delete script), and the floor of a fenced one (the fewest
//! Redis calls that keep redbaton's token guarantees, with no other work).

/// One key's bare lock.
pub struct FloorLock {
    key: String,
    compare_and_delete: redis::Script,
}

impl FloorLock {
    pub fn new(key: &str) -> Self {
        FloorLock {
            key: key.to_owned(),
            compare_and_delete: redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            ),
        }
    }

    /// Takes the free lock and frees it: one cycle.
    pub fn cycle(&self, conn: &mut redis::Connection) {
        let taken: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg("me")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(conn)
            .expect("SET");
        assert!(taken.is_some(), "the bare lock was free");
        let freed: i64 = self
            .compare_and_delete
            .key(&self.key)
            .arg("me")
            .invoke(conn)
            .expect("compare-and-delete");
        assert_eq!(freed, 1, "the bare lock was ours");
    }
}

/// A fenced lock at its floor: a hash of owner, depth and token beside a
/// token counter, as redbaton keeps them, each token max(counter + 1, the
/// server's clock in microseconds) so that tokens keep increasing across a
/// restart from an older snapshot. Its acquire makes the five calls a fresh
/// fenced, re-entrant acquisition needs (read the holder, the clock, the
/// counter swapped in one `SET ... GET`, write the holder, its lease) and
/// its release the two of an owner-checked delete; no re-entry, waiting,
/// marks or hand-offs. What redbaton's cycle spends above it is its own
/// logic, not Redis's calls.
pub struct FencedFloorLock {
    keys: [String; 2],
    acquire: redis::Script,
    release: redis::Script,
}

impl FencedFloorLock {
    pub fn new(key: &str) -> Self {
        FencedFloorLock {
            keys: [format!("{key}:lock"), format!("{key}:fence")],
            acquire: redis::Script::new(
                r"local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if held[1] then return 0 end
local now = redis.call('TIME')
local clock = now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
local stored = redis.call('SET', KEYS[2], clock, 'PX', ARGV[3], 'GET')
local token = clock
if stored and (#stored > #clock or (#stored == #clock and stored >= clock)) then
  token = string.format('%.0f', tonumber(stored) + 1)
  redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'fence', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token",
            ),
            release: redis::Script::new(
                r"local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if held[1] == ARGV[1] and held[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0",
            ),
        }
    }

    /// Takes the free lock and frees it: one cycle. Returns the token.
    pub fn cycle(&self, conn: &mut redis::Connection) -> u64 {
        let token: u64 = self
            .acquire
            .key(&self.keys[0])
            .key(&self.keys[1])
            .arg("me")
            .arg(30_000)
            .arg(86_400_000)
            .invoke(conn)
            .expect("fenced acquire");
        assert!(token > 0, "the fenced lock was free");
        let freed: i64 = self
            .release
            .key(&self.keys[0])
            .arg("me")
            .arg(token)
            .invoke(conn)
            .expect("fenced release");
        assert_eq!(freed, 1, "the fenced lock was ours");
        token
    }
}

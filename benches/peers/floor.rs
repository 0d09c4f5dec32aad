//! The floor of any Redis lock, for the benches to measure redbaton
//! against: `SET key me NX PX`, then a compare-and-delete script, on one
//! connection of the caller's.

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

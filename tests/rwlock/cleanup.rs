//! What a read-write lock leaves in Redis, and scripts the server forgot.

use std::time::Duration;

use crate::across_topologies;
use crate::rw_key;

across_topologies! {
    but_masters;
    /// After readers, a writer, a writer that gave up, an upgradable
    /// reader that upgraded and one that gave up upgrading are all gone,
    /// only the fencing counter and batons are left, and all of them
    /// expire.
    fn after_the_last_release_only_expiring_keys_are_left(deployment) {
        let (a, b) = (deployment.client(), deployment.client());
        let (mine, theirs) = (a.rw_lock("tidy").unwrap(), b.rw_lock("tidy").unwrap());
        let read = mine.read().unwrap();
        let shared = theirs.read().unwrap();
        assert!(mine.try_write().is_err(), "an upgrade");
        drop(shared);
        assert!(theirs.try_write_for(Duration::from_millis(300)).unwrap().is_none(), "gave up");
        read.unlock().unwrap();
        let write = theirs.write().unwrap();
        assert!(mine.try_read_for(Duration::from_millis(200)).unwrap().is_none());
        write.unlock().unwrap();
        mine.read().unwrap().unlock().unwrap();
        let up = mine.upgradable_read().unwrap();
        assert!(theirs.try_upgradable_read_for(Duration::from_millis(200)).unwrap().is_none());
        let shared = theirs.read().unwrap();
        assert!(up.try_upgrade_for(Duration::from_millis(300)).unwrap().is_none(), "gave up");
        shared.unlock().unwrap();
        up.upgrade().unwrap().unlock().unwrap();
        up.downgrade().unwrap().unlock().unwrap();

        let mut raw = deployment.server_for(&rw_key("tidy", "write")).connection();
        for part in ["write", "readers", "depths", "writers", "upgradable"] {
            let exists: bool = redis::cmd("EXISTS").arg(rw_key("tidy", part)).query(&mut raw).unwrap();
            assert!(!exists, "{part} is left after the last release");
        }
        for part in ["fence", "rbaton", "wbaton", "ubaton", "upbaton"] {
            let ttl: i64 = redis::cmd("PTTL").arg(rw_key("tidy", part)).query(&mut raw).unwrap();
            assert!(ttl == -2 || ttl > 0, "{part} never expires (PTTL {ttl})");
        }
    }
}

across_topologies! {
    but_masters;
    /// `SCRIPT FLUSH` while holds live: the next calls load the scripts
    /// again, releases included.
    fn calls_after_script_flush_still_work(deployment) {
        let client = deployment.client();
        let lock = client.rw_lock("flushed").unwrap();
        let read = lock.read().unwrap();
        let mut raw = deployment.server_for(&rw_key("flushed", "write")).connection();
        redis::cmd("SCRIPT").arg("FLUSH").query::<()>(&mut raw).unwrap();
        read.unlock().unwrap();
        let write = lock.write().unwrap();
        redis::cmd("SCRIPT").arg("FLUSH").query::<()>(&mut raw).unwrap();
        write.unlock().unwrap();
        lock.try_read().unwrap().expect("free").unlock().unwrap();
    }
}

//! What a client leaves behind when it is dropped (issue 9, R2): no
//! threads. A binary of its own, so that no other test's threads are
//! counted.

mod support;

use std::fs;
use std::time::Duration;

use support::eventually;

/// Serializes the tests of this binary.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Threads of this process, from /proc.
fn threads() -> usize {
    fs::read_dir("/proc/self/task").unwrap().count()
}

across_topologies! {
    /// On every topology: the cluster's per-node pools and timers, and the
    /// sentinel event thread, end with their client too.
    fn dropped_clients_end_their_threads_promptly(deployment) {
        // One topology at a time: the count is of the whole process.
        let _alone = ALONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let baseline = threads();
        for n in 0..20 {
            let client = deployment.client();
            let lock = client.lock(&format!("resources:{n}")).unwrap();
            // A renewed lock starts the watchdog; a timed-out wait parks,
            // which starts the unblock timer and opens a parking connection.
            let guard = lock.lock().unwrap();
            let other = deployment.client();
            let waited = std::thread::scope(|s| {
                s.spawn(|| {
                    other
                        .lock(&format!("resources:{n}"))
                        .unwrap()
                        .try_lock_for(Duration::from_millis(20))
                        .unwrap()
                        .is_none()
                })
                .join()
                .unwrap()
            });
            assert!(waited);
            drop(guard);
            drop((client, other));
        }
        let mut last = 0;
        let dropped = std::time::Instant::now();
        eventually(
            Duration::from_secs(1),
            "the clients' threads to end",
            || {
                last = threads();
                last <= baseline
            },
        );
        println!("threads: {baseline} before, {last} after 40 clients, {:?} after the drop", dropped.elapsed());
    }
}

//! What a client leaves behind when it is dropped (issue 9, R2): no
//! threads. A binary of its own, so that no other test's threads are
//! counted.

mod support;

use std::fs;
use std::time::Duration;

use support::eventually;
use testkit::RedisServer;

/// Threads of this process, from /proc.
fn threads() -> usize {
    fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn dropped_clients_end_their_threads_promptly() {
    let server = RedisServer::start();
    let baseline = threads();
    for n in 0..50 {
        let client = support::client(&server);
        let lock = client.lock(&format!("resources:{n}")).unwrap();
        // A renewed lock starts the watchdog; a timed-out wait parks, which
        // starts the unblock timer and opens a parking connection.
        let guard = lock.lock().unwrap();
        let other = support::client(&server);
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
    eventually(
        Duration::from_secs(1),
        "the clients' threads to end",
        || {
            last = threads();
            last <= baseline
        },
    );
    println!("threads: {baseline} before, {last} after 100 clients");
}

//! Wake-ups at the waiter's own time, not at Redis's timer tick (issue 11):
//! against a server with default settings (`hz 10`, whose `BLPOP` timeouts
//! fire up to 100 ms late), deadlines and lease ends are honoured within a
//! few milliseconds. The bounds here are generous; `cargo bench --bench
//! lock` measures the figures.

use crate::across_topologies;
use crate::support;

use std::mem;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::JoinWithin;
use redbaton::Client;
use testkit::RedisServer;

across_topologies! {
/// A holder with a 1 s fixed lease dies (its guard is forgotten: no
/// release, no renewal); a waiter that started at 0 %, 40 % or 80 % of the
/// lease gets the lock within 50 ms of the lease's end.
fn a_dead_holders_lock_goes_to_a_waiter_when_the_lease_ends_at_every_phase(deployment) {
    let lease = Duration::from_secs(1);
    for (round, phase) in [0.0, 0.4, 0.8].into_iter().enumerate() {
        let name = format!("crashed-{round}");
        let holder = deployment.client();
        let waiter = deployment.client();
        let waiting_lock = waiter.lock(&name).unwrap();
        let taken = Instant::now();
        let guard = holder
            .lock(&name)
            .unwrap()
            .with_fixed_lease(lease)
            .unwrap()
            .lock()
            .unwrap();
        mem::forget(guard); // a crash: nothing is released or renewed
        thread::sleep(lease.mul_f64(phase));
        let acquired = thread::spawn(move || {
            let guard = waiting_lock.try_lock_for(Duration::from_secs(5)).unwrap();
            (Instant::now(), guard.is_some())
        })
        .joined();
        assert!(acquired.1, "round {round}: not acquired");
        let after_end = acquired.0.saturating_duration_since(taken + lease);
        println!("phase {phase}: acquired {after_end:?} after the lease ended");
        assert!(
            after_end < Duration::from_millis(50),
            "phase {phase}: acquired {after_end:?} after the lease ended"
        );
    }
}
}

across_topologies! {
/// `try_lock_for` on a held lock returns `None` within a few milliseconds
/// of its deadline, for short and long waits alike (on a cluster, the
/// unblock goes to the node the waiter parks on).
fn timed_out_waits_end_at_their_deadline(deployment) {
    let holder = deployment.client();
    let waiter = deployment.client();
    let _held = holder.lock("held").unwrap().lock().unwrap();
    let lock = waiter.lock("held").unwrap();
    let mut worst = Duration::ZERO;
    for wait in [10, 30, 70, 120, 180, 250] {
        let wait = Duration::from_millis(wait);
        let started = Instant::now();
        assert!(lock.try_lock_for(wait).unwrap().is_none());
        let overshoot = started.elapsed().saturating_sub(wait);
        worst = worst.max(overshoot);
    }
    println!("worst overshoot {worst:?}");
    assert!(worst < Duration::from_millis(50), "overshoot {worst:?}");
}
}

/// Under an ACL without `CLIENT UNBLOCK`, waits still end (on the server's
/// timer), with one warning.
#[test]
fn without_client_unblock_parks_end_on_the_servers_timer() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("plain")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("+@all")
        .arg("-client|unblock")
        .query::<()>(&mut raw)
        .unwrap();
    let url = format!("redis://plain:secret@127.0.0.1:{}/", server.port());
    let client = Client::builder(url)
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let holder = support::client(&server);
    let _held = holder.lock("acl").unwrap().lock().unwrap();
    let lock = client.lock("acl").unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        assert!(lock
            .try_lock_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
        // The server's tick: up to ~100 ms late, never hung.
        assert!(started.elapsed() < Duration::from_millis(400));
    }
}

//! Leases: the watchdog keeps live holders' locks, fixed leases end on time,
//! paused holders lose their lock, and lost guards say so.

use crate::across_topologies;
use crate::support;
use crate::support::{Deployment, Topology};

use std::thread;
use std::time::{Duration, Instant};

use crate::support::{client, eventually, spawn_child};
use redbaton::{Client, Error};
use testkit::RedisServer;

/// This file's child-process roles (run by the binary's `child_entry`);
/// false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "try-for-two-seconds" => {
            let client = Client::open(url).unwrap();
            let got = client
                .lock("renewed")
                .unwrap()
                .try_lock_for(Duration::from_secs(2))
                .unwrap();
            println!("GOT {}", got.is_some());
        }
        "wait-then-hold" => {
            let client = Client::open(url).unwrap();
            let lock = client.lock("fixed").unwrap();
            println!("WAITING");
            let guard = lock
                .try_lock_for(Duration::from_secs(10))
                .unwrap()
                .expect("acquired");
            println!("ACQUIRED {}", guard.fencing_token());
            // Hold until the parent has looked.
            let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
            let _: Option<(String, String)> = redis::cmd("BLPOP")
                .arg("parent-done")
                .arg(10)
                .query(&mut raw)
                .unwrap();
            guard.unlock().unwrap();
            println!("RELEASED");
        }
        "hold-and-watch" => {
            let client = Client::builder(url)
                .default_lease(Duration::from_secs(1))
                .build()
                .unwrap();
            let guard = client.lock("paused").unwrap().lock().unwrap();
            println!("ACQUIRED {}", guard.fencing_token());
            let deadline = Instant::now() + Duration::from_secs(30);
            while !guard.is_lost() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            println!("LOST {}", guard.is_lost());
            let refused = guard.unlock().unwrap_err();
            println!("UNLOCK {}", refused.is_lost());
        }
        _ => return false,
    }
    true
}

fn client_with_lease(server: &RedisServer, lease: Duration) -> Client {
    Client::builder(server.url())
        .default_lease(lease)
        .build()
        .unwrap()
}

#[test]
fn a_renewed_guard_outlives_three_leases_and_keeps_another_process_out() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let client = client_with_lease(&server, lease);
    let lock = client.lock("renewed").unwrap();
    let guard = lock.lock().unwrap();
    let mut other = spawn_child("try-for-two-seconds", &server);
    // The child tries for 2 s; we hold for all of it (over 3 leases).
    assert_eq!(other.wait_for_line("GOT", Duration::from_secs(30)), "false");
    assert!(!guard.is_lost());
    let left = guard.remaining_lease().unwrap();
    assert!(left <= lease && left > Duration::ZERO, "{left:?}");
    let stats = client.watchdog_stats();
    assert!(stats.renewals >= 5, "{stats:?}");
    assert_eq!(stats.losses, 0);
    guard.unlock().unwrap();
}

#[test]
fn a_handle_with_its_own_renewed_lease_keeps_the_lock_past_that_lease() {
    // The client's default lease (30 s) would hide a watchdog that renews
    // with it instead of the ownership's lease: the lock would then never
    // show a TTL under 600 ms, nor need renewing within 2 s.
    let server = RedisServer::start();
    let client = support::client(&server);
    let lease = Duration::from_millis(600);
    let lock = client.lock("renewed").unwrap().with_lease(lease).unwrap();
    let guard = lock.lock().unwrap();
    let left = guard.remaining_lease().unwrap();
    assert!(left <= lease && left > Duration::ZERO, "{left:?}");
    let mut other = spawn_child("try-for-two-seconds", &server);
    // The child tries for 2 s (over 3 leases); we hold for all of it.
    assert_eq!(other.wait_for_line("GOT", Duration::from_secs(30)), "false");
    assert!(!guard.is_lost());
    let left = guard.remaining_lease().unwrap();
    assert!(left <= lease && left > Duration::ZERO, "{left:?}");
    let stats = client.watchdog_stats();
    assert!(
        stats.renewals >= 3,
        "renewed every third of 600 ms: {stats:?}"
    );
    assert_eq!(stats.losses, 0);
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn with_lease_refuses_a_lease_outside_1ms_to_a_year() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap(); // never contacted
    let lock = client.lock("bounds").unwrap();
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(366 * 24 * 3600),
    ] {
        let err = lock.with_lease(lease).unwrap_err();
        assert!(
            matches!(err, Error::InvalidLease { lease: refused } if refused == lease),
            "{err}"
        );
    }
    assert!(lock.with_lease(Duration::from_millis(1)).is_ok());
}

#[test]
fn with_a_fixed_lease_another_process_takes_the_lock_and_the_old_guard_reports_lost() {
    let deployment = Deployment::start(Topology::Single);
    let (server, client) = (deployment.server(), deployment.client());
    let lock = client
        .lock("fixed")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(500))
        .unwrap();
    let guard = lock.lock().unwrap();
    let acquired = Instant::now();
    let old_token = guard.fencing_token();

    let mut other = spawn_child("wait-then-hold", server);
    other.wait_for_line("WAITING", Duration::from_secs(30));
    let new_token: u64 = other
        .wait_for_line("ACQUIRED", Duration::from_secs(10))
        .parse()
        .unwrap();
    let took_over = acquired.elapsed();
    assert!(
        took_over >= Duration::from_millis(450),
        "{took_over:?}: before the lease ended"
    );
    assert!(new_token > old_token);

    assert!(guard.is_lost(), "the lease ended under a live guard");
    let holder = lock.holder().unwrap().expect("the other process holds it");
    let err = guard.unlock().unwrap_err();
    assert!(matches!(err, Error::LockLost { .. }), "{err}");
    let after = lock.holder().unwrap().expect("still held");
    assert_eq!(
        (&after.owner, after.depth, after.fencing_token),
        (&holder.owner, holder.depth, holder.fencing_token),
        "the new holder's lock is untouched"
    );
    assert_eq!(holder.fencing_token, new_token);

    let mut raw = server.connection();
    redis::cmd("RPUSH")
        .arg("parent-done")
        .arg(1)
        .query::<()>(&mut raw)
        .unwrap();
    other.wait_for_line("RELEASED", Duration::from_secs(10));
}

#[test]
fn a_holder_paused_past_its_lease_loses_the_lock_and_learns_it_on_resume() {
    let server = RedisServer::start();
    let mut holder = spawn_child("hold-and-watch", &server);
    let old_token: u64 = holder
        .wait_for_line("ACQUIRED", Duration::from_secs(30))
        .parse()
        .unwrap();
    holder.signal_stop();

    let client = client(&server);
    let lock = client.lock("paused").unwrap();
    let started = Instant::now();
    let guard = lock
        .try_lock_for(Duration::from_secs(5))
        .unwrap()
        .expect("the paused holder's lease ends");
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert!(guard.fencing_token() > old_token);

    holder.signal_continue();
    assert_eq!(holder.wait_for_line("LOST", Duration::from_secs(5)), "true");
    assert_eq!(
        holder.wait_for_line("UNLOCK", Duration::from_secs(5)),
        "true"
    );
    // The resumed holder changed nothing: the lock is still ours.
    assert!(!guard.is_lost());
    assert!(guard.remaining_lease().unwrap() > Duration::ZERO);
    guard.unlock().unwrap();
}

across_topologies! {
    fn extend_by_the_owner_pushes_a_fixed_lease_out(deployment) {
        let client = deployment.client();
        let lock = client
            .lock("extended")
            .unwrap()
            .with_fixed_lease(Duration::from_millis(400))
            .unwrap();
        let guard = lock.lock().unwrap();
        guard.extend(Duration::from_secs(10)).unwrap();
        thread::sleep(Duration::from_millis(600)); // past the original lease
        assert!(!guard.is_lost());
        assert!(guard.remaining_lease().unwrap() > Duration::from_secs(5));
        assert!(lock.is_locked().unwrap());
        let err = guard.extend(Duration::ZERO).unwrap_err();
        assert!(matches!(err, Error::InvalidLease { .. }), "{err}");
        guard.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());
    }
}

across_topologies! {
    fn extend_by_a_guard_that_lost_its_lock_is_refused_and_changes_nothing(deployment) {
        let client = deployment.client();
        let lock = client
            .lock("lapsed")
            .unwrap()
            .with_fixed_lease(Duration::from_millis(200))
            .unwrap();
        let stale = lock.lock().unwrap();
        eventually(Duration::from_secs(3), "the lease to end", || {
            !lock.is_locked().unwrap()
        });
        let other_client = deployment.client();
        let successor = other_client
            .lock("lapsed")
            .unwrap()
            .with_fixed_lease(Duration::from_secs(5))
            .unwrap()
            .lock()
            .unwrap();

        let err = stale.extend(Duration::from_secs(60)).unwrap_err();
        assert!(err.is_lost(), "{err}");
        assert!(stale.is_lost());
        assert!(
            successor.remaining_lease().unwrap() <= Duration::from_secs(5),
            "not extended by the stale guard"
        );
        assert!(stale.remaining_lease().unwrap_err().is_lost());
        drop(stale);
        assert_eq!(
            lock.holder().unwrap().unwrap().fencing_token,
            successor.fencing_token()
        );
    }
}

#[test]
fn holder_reports_owner_depth_token_and_lease() {
    let server = RedisServer::start();
    let client = client_with_lease(&server, Duration::from_secs(20));
    let lock = client.lock("inspected").unwrap();
    assert_eq!(lock.holder().unwrap(), None);
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let holder = lock.holder().unwrap().unwrap();
    assert_eq!(holder.depth, 2);
    assert_eq!(holder.fencing_token, outer.fencing_token());
    let left = holder.remaining_lease.unwrap();
    assert!(
        left > Duration::from_secs(15) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    drop(inner);
    assert_eq!(lock.holder().unwrap().unwrap().depth, 1);
    drop(outer);
    assert_eq!(lock.holder().unwrap(), None);
}

#[test]
fn renewal_finds_a_force_unlocked_lock_gone_and_does_not_recreate_it() {
    let server = RedisServer::start();
    let client = client_with_lease(&server, Duration::from_millis(300));
    let lock = client.lock("removed").unwrap();
    let guard = lock.lock().unwrap();
    assert!(support::client(&server)
        .lock("removed")
        .unwrap()
        .force_unlock()
        .unwrap());
    eventually(Duration::from_secs(3), "the watchdog to notice", || {
        guard.is_lost()
    });
    assert_eq!(client.watchdog_stats().losses, 1);
    // The round that found the loss is counted when it ends.
    thread::sleep(Duration::from_millis(50));
    let rounds = client.watchdog_stats().rounds;
    thread::sleep(Duration::from_millis(400)); // more than one renewal interval
    assert_eq!(
        client.watchdog_stats().rounds,
        rounds,
        "a lost lock is not renewed"
    );
    assert!(
        !lock.is_locked().unwrap(),
        "renewal never re-creates a lock"
    );
    assert!(guard.unlock().unwrap_err().is_lost());
}

#[test]
fn reentered_locks_share_one_renewal_that_ends_with_the_last_guard() {
    let server = RedisServer::start();
    let client = client_with_lease(&server, Duration::from_millis(300));
    let lock = client.lock("shared-renewal").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    eventually(Duration::from_secs(3), "three renewal rounds", || {
        client.watchdog_stats().rounds >= 3
    });
    let stats = client.watchdog_stats();
    assert_eq!(
        stats.renewals, stats.rounds,
        "one renewal per round for two guards: {stats:?}"
    );
    drop(inner);
    assert!(!outer.is_lost());
    outer.unlock().unwrap();
    // A round already in flight at the release may still come back (it
    // changes nothing in Redis); none starts after it.
    thread::sleep(Duration::from_millis(50));
    let after = client.watchdog_stats();
    thread::sleep(Duration::from_millis(400)); // more than one renewal interval
    assert_eq!(
        client.watchdog_stats().rounds,
        after.rounds,
        "no renewal after the last release"
    );
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn renewal_that_cannot_reach_redis_marks_the_guard_lost_when_the_lease_ends() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let client = Client::builder(server.url())
        .default_lease(lease)
        .io_timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let lock = client.lock("unreachable").unwrap();
    let guard = lock.lock().unwrap();
    // Waited on the loss signal, which the watchdog sends when it marks the
    // guard lost: `is_lost()` turns true by the clock alone a moment
    // earlier, and a release sent then may still find the lock ours (a
    // renewal stuck in the paused server lands when it resumes).
    let lost = guard.lost();
    server.pause();
    let paused = Instant::now();
    let told = lost.recv_timeout(Duration::from_secs(5));
    let noticed = paused.elapsed();
    server.resume();
    assert_eq!(
        told,
        Ok(redbaton::LostReason::Unreachable),
        "after {noticed:?}"
    );
    assert!(guard.is_lost());
    // Not before the lease could have ended, and not long after.
    assert!(noticed >= lease / 2, "lost after only {noticed:?}");
    assert!(
        noticed < lease + Duration::from_millis(800),
        "lost only after {noticed:?}"
    );
    assert!(guard.unlock().unwrap_err().is_lost());
}

#[test]
fn a_renewal_left_unanswered_is_given_up_on_in_time_to_renew_before_a_short_lease_ends() {
    let server = RedisServer::start();
    let proxy = testkit::FaultProxy::start(server.port());
    let lease = Duration::from_secs(2);
    let (builder, renewal_failed) = support::telling_renewal_failures(
        Client::builder(proxy.url())
            .default_lease(lease)
            // Longer than the lease: a renewal round waiting this long for
            // a lost reply would outlive the hold it renews.
            .io_timeout(Duration::from_secs(3)),
    );
    let client = builder.build().unwrap();
    let lock = client.lock("short-lease").unwrap();
    let guard = lock.lock().unwrap();
    let taken = Instant::now();
    // The first renewal (a third of the lease in) is never answered.
    proxy.set_silent(true);
    let given_up = renewal_failed
        .recv_timeout(Duration::from_secs(10))
        .expect("the unanswered renewal is reported");
    proxy.set_silent(false);
    assert!(
        given_up - taken < lease,
        "given up on {:?} after the lock was taken, past its lease",
        given_up - taken
    );
    // Renewed again before the first lease ended: the hold outlives it.
    thread::sleep(
        (taken + lease + Duration::from_millis(500)).saturating_duration_since(Instant::now()),
    );
    assert!(!guard.is_lost(), "the hold ended with its first lease");
    let mut raw = server.connection();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(support::lock_key("short-lease"))
        .query(&mut raw)
        .unwrap();
    assert!(pttl > 0, "the lock's key lives on (PTTL {pttl})");
    guard.unlock().unwrap();
}

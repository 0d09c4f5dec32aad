//! Redis Sentinel only: failovers under parked waiters and under a holder,
//! with and without `replica_acks`, and the errors of a service the
//! sentinels do not know and of replica acknowledgements no replica gives.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error, Topology};
use testkit::{RedisSentinels, RedisServer};

use crate::support::{
    cut_replica, eventually, lock_key, restore_replica, wait_for_replica, Deployment, JoinWithin,
    Topology as Kind, SERVICE,
};

/// How long a failover of the test deployment may take: a second to see
/// the master down, then an election and a promotion.
const FAILOVER: Duration = Duration::from_secs(20);

/// The lease of the holders that must outlive a failover: renewals stop
/// from the master's death until the client finds the new one.
const LEASE: Duration = Duration::from_secs(6);

/// Waits until the sentinels name a master other than `old`.
fn wait_for_failover(sentinels: &RedisSentinels, old: u16) {
    eventually(FAILOVER, "the sentinels promote the replica", || {
        sentinels
            .current_master_port()
            .is_some_and(|port| port != old)
    });
}

#[test]
fn parked_waiters_acquire_after_the_master_is_killed() {
    let deployment = Deployment::start(Kind::Sentinel);
    let sentinels = deployment.sentinels();
    let name = "failover";
    let lease = Duration::from_secs(2);
    let holder = deployment.client();
    // A holder that never releases: its lease must end on the new master.
    std::mem::forget(
        holder
            .lock(name)
            .unwrap()
            .with_fixed_lease(lease)
            .unwrap()
            .lock()
            .unwrap(),
    );
    wait_for_replica(sentinels.master(), "test-sync");

    let inside = Arc::new(AtomicUsize::new(0));
    let waiters_client = deployment.client();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let lock = waiters_client.lock(name).unwrap();
            let inside = Arc::clone(&inside);
            thread::spawn(move || {
                let guard = lock
                    .try_lock_for(lease + FAILOVER)
                    .unwrap()
                    .expect("acquired within lease + failover time");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                thread::sleep(Duration::from_millis(20));
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().unwrap();
                Instant::now()
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    sentinels.master().kill();
    let last = waiters.into_iter().map(JoinWithin::joined).max().unwrap();
    let took = last.duration_since(killed);
    assert!(took < lease + FAILOVER, "{took:?}");
    // Every sentinel learns of the new master in its own time.
    wait_for_failover(sentinels, sentinels.master().port());
    println!("three waiters acquired {took:?} after the master was killed");
}

fn on_replica(sentinels: &RedisSentinels, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(lock_key(name))
        .query(&mut sentinels.replicas()[0].connection())
        .unwrap()
}

/// Kills the master and waits for the sentinels to promote its replica.
fn fail_over(sentinels: &RedisSentinels) {
    let master = sentinels.master();
    master.kill();
    wait_for_failover(sentinels, master.port());
}

#[test]
fn with_replica_acks_a_lock_is_granted_only_once_a_replica_has_it_and_survives_failover() {
    let deployment = Deployment::start(Kind::Sentinel);
    let sentinels = deployment.sentinels();
    let holder = deployment
        .builder()
        .default_lease(LEASE)
        .replica_acks(1, Duration::from_millis(500))
        .build()
        .unwrap();
    let lock = holder.lock("confirmed").unwrap();

    // No replica can confirm: not granted, and nothing left behind.
    cut_replica(sentinels);
    let err = lock.try_lock_for(Duration::from_secs(2)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                wanted: 1,
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        !lock.is_locked().unwrap(),
        "the unconfirmed acquisition was undone"
    );

    restore_replica(sentinels);
    let guard = lock
        .try_lock_for(Duration::from_secs(5))
        .unwrap()
        .expect("free");
    assert!(
        on_replica(sentinels, "confirmed"),
        "granted only once the replica has it"
    );
    fail_over(sentinels);

    let other = deployment.client();
    let other_lock = other.lock("confirmed").unwrap();
    let holder_seen = other_lock
        .holder()
        .unwrap()
        .expect("the new master holds the lock");
    assert_eq!(holder_seen.fencing_token, guard.fencing_token());
    assert!(
        other_lock
            .try_lock_for(Duration::from_secs(1))
            .unwrap()
            .is_none(),
        "nobody else may take it"
    );
    // Past the lease: only renewals on the new master kept it (which has
    // no replica left: they are warned about, not failed).
    thread::sleep(LEASE + Duration::from_secs(1));
    assert!(!guard.is_lost());
    assert!(other_lock.try_lock().unwrap().is_none());
    guard.unlock().unwrap();
    assert!(other_lock.try_lock().unwrap().is_some());
}

/// The loss `replica_acks` prevents, shown: without it, a lock is granted
/// while no replica has it, the promoted replica never saw it, another
/// client takes it while its first holder still has a guard, and that
/// guard learns of it at its next renewal.
#[test]
fn without_replica_acks_a_failover_can_lose_a_just_taken_lock() {
    let deployment = Deployment::start(Kind::Sentinel);
    let sentinels = deployment.sentinels();
    let holder = deployment.builder().default_lease(LEASE).build().unwrap();
    cut_replica(sentinels);
    let guard = holder
        .lock("unconfirmed")
        .unwrap()
        .try_lock_for(Duration::from_secs(5))
        .unwrap()
        .expect("free");
    assert!(!on_replica(sentinels, "unconfirmed"));
    fail_over(sentinels);

    let other = deployment.client();
    let taken = other
        .lock("unconfirmed")
        .unwrap()
        .try_lock_for(Duration::from_secs(10))
        .unwrap()
        .expect("the new master never saw the lock");
    assert!(taken.fencing_token() > guard.fencing_token());
    eventually(
        Duration::from_secs(5),
        "the first guard learns it lost the lock",
        || guard.is_lost(),
    );
}

#[test]
fn sentinels_that_do_not_know_the_service_are_a_clear_error() {
    let sentinels = RedisSentinels::start(SERVICE, 0, 1);
    let client = Client::builder(Topology::sentinel(
        "no-such-service",
        sentinels.sentinel_urls(),
    ))
    .build()
    .unwrap();
    let err = client.lock("x").unwrap().try_lock().unwrap_err();
    assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-service"), "{err}");
}

#[test]
fn replica_acks_without_replicas_is_a_clear_error_and_takes_nothing() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .replica_acks(1, Duration::from_millis(100))
        .build()
        .unwrap();
    let lock = client.lock("alone").unwrap();
    let err = lock.try_lock().unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                wanted: 1,
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!lock.is_locked().unwrap(), "the acquisition was undone");
    let err = lock.try_lock_for(Duration::from_millis(500)).unwrap_err();
    assert!(matches!(err, Error::NotReplicated { .. }), "{err:?}");
    assert!(!lock.is_locked().unwrap());
}

/// After `SENTINEL FAILOVER` the old master stays up and writable for a
/// while; the client must not keep using it. The `+switch-master` event
/// moves it: a lock taken after the switch lives on the new master.
#[test]
fn a_client_follows_a_switch_master_event_while_the_old_master_stays_up() {
    let deployment = Deployment::start(Kind::Sentinel);
    let sentinels = deployment.sentinels();
    let client = deployment.client();
    let before = client.lock("before").unwrap().lock().unwrap();
    drop(before);
    let old = sentinels.master().port();
    wait_for_replica(sentinels.master(), "test-sync");
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query::<()>(&mut sentinels.sentinels()[0].connection())
        .unwrap();
    wait_for_failover(sentinels, old);
    let new = sentinels.current_master_port().unwrap();
    let new_master = [sentinels.master()]
        .into_iter()
        .chain(sentinels.replicas())
        .find(|s| s.port() == new)
        .unwrap();
    // Give the event a moment to arrive, far less than the ~10 s the old
    // master may stay writable.
    thread::sleep(Duration::from_millis(500));
    let guard = client
        .lock("after")
        .unwrap()
        .try_lock_for(Duration::from_secs(10))
        .unwrap()
        .expect("free");
    let on_new: bool = redis::cmd("EXISTS")
        .arg(lock_key("after"))
        .query(&mut new_master.connection())
        .unwrap();
    assert!(on_new, "the lock was taken on the new master");
    guard.unlock().unwrap();
}

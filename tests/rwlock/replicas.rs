//! Sentinel only: with `replica_acks`, a release is confirmed by a
//! replica, and one that is not is sent again to the new master after a
//! failover.

use std::time::{Duration, Instant};

use redbaton::Error;

use crate::rw_key;
use crate::support::{cut_replica, eventually, wait_for_replica, Deployment, Topology, SERVICE};

/// Issue 21, item 1: a write hold released on the old master only (its
/// replica's link is down) is free on the promoted replica within about
/// the failover time, not at the end of its 30 s lease.
#[test]
fn a_write_release_the_replica_missed_is_sent_again_to_the_new_master() {
    let deployment = Deployment::start(Topology::Sentinel);
    let sentinels = deployment.sentinels();
    let holder = deployment
        .builder()
        .default_lease(Duration::from_secs(30))
        .replica_acks(1, Duration::from_millis(300))
        .build()
        .unwrap();
    let name = "released-before-failover";
    let guard = holder.rw_lock(name).unwrap().write().unwrap();
    wait_for_replica(sentinels.master(), "test-sync");
    cut_replica(sentinels);
    let released = guard.unlock();
    println!("unlock: {released:?}");
    assert!(
        matches!(released, Ok(()) | Err(Error::NotReplicated { .. })),
        "{released:?}"
    );
    let on_replica: bool = redis::cmd("EXISTS")
        .arg(rw_key(name, "write"))
        .query(&mut sentinels.replicas()[0].connection())
        .unwrap();
    assert!(on_replica, "the replica missed the release");

    let old = sentinels.master().port();
    let started = Instant::now();
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query::<()>(&mut sentinels.sentinels()[0].connection())
        .unwrap();
    eventually(Duration::from_secs(20), "the replica is promoted", || {
        sentinels.current_master_port().is_some_and(|p| p != old)
    });
    let other = deployment.client();
    let taken = other
        .rw_lock(name)
        .unwrap()
        .try_write_for(Duration::from_secs(20))
        .unwrap()
        .expect("free on the new master well before the lease ends");
    let took = started.elapsed();
    println!("free on the new master {took:?} after SENTINEL FAILOVER (lease 30 s)");
    assert!(took < Duration::from_secs(15), "{took:?}");
    drop(taken);
}

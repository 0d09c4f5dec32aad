//! Sentinel only: with `replica_acks`, permits are granted only once a
//! replica has them.

use std::time::Duration;

use redbaton::Error;

use crate::sem_keys;
use crate::support::{cut_replica, restore_replica, Deployment, Topology};

#[test]
fn with_replica_acks_permits_are_granted_only_once_a_replica_has_them() {
    let deployment = Deployment::start(Topology::Sentinel);
    let sentinels = deployment.sentinels();
    let client = deployment
        .builder()
        .replica_acks(1, Duration::from_millis(300))
        .build()
        .unwrap();
    let sem = client.semaphore("confirmed").unwrap();
    sem.try_set_permits(2).unwrap();

    // No replica can confirm: not granted, and nothing held afterwards.
    cut_replica(sentinels);
    for result in [
        sem.try_acquire(),
        sem.try_acquire_many_for(2, Duration::from_secs(1)),
    ] {
        let err = result.unwrap_err();
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
    }
    assert_eq!(sem.available_permits().unwrap(), 2, "undone");

    restore_replica(sentinels);
    let permits = sem.acquire_many(2).unwrap();
    let [_, holders, ..] = sem_keys("confirmed");
    let on_replica: u32 = redis::cmd("ZCARD")
        .arg(&holders)
        .query(&mut sentinels.replicas()[0].connection())
        .unwrap();
    assert_eq!(
        on_replica, 1,
        "the replica had the permits when they were granted"
    );
    permits.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 2);
}

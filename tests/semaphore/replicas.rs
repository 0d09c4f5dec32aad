//! Sentinel only: with `replica_acks`, permits are granted only once a
//! replica has them.

use std::time::Duration;

use redbaton::Error;
use testkit::{RedisSentinels, RedisServer};

use crate::sem_keys;
use crate::support::{eventually, wait_for_replica, Deployment, Topology};

fn config_set(server: &RedisServer, key: &str, value: &str) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query::<()>(&mut server.connection())
        .unwrap();
}

/// Cuts the replica off its master (wrong credentials, link killed).
fn cut_replica(sentinels: &RedisSentinels) {
    let (master, replica) = (sentinels.master(), &sentinels.replicas()[0]);
    wait_for_replica(master, "test-sync");
    config_set(replica, "masteruser", "no-such-user");
    config_set(replica, "masterauth", "wrong");
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query::<u32>(&mut master.connection())
        .unwrap();
    eventually(Duration::from_secs(5), "the replica's link is down", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.connection())
            .unwrap();
        info.contains("master_link_status:down")
    });
}

fn restore_replica(sentinels: &RedisSentinels) {
    let replica = &sentinels.replicas()[0];
    config_set(replica, "masteruser", "");
    config_set(replica, "masterauth", "");
    wait_for_replica(sentinels.master(), "test-sync");
}

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

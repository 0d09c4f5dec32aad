//! The throwaway Sentinel deployment comes together, and fails over when
//! its master dies.

use std::time::{Duration, Instant};

use testkit::RedisSentinels;

#[test]
fn sentinels_report_the_master_and_fail_over_to_the_replica_when_it_dies() {
    let deployment = RedisSentinels::start("svc", 1, 3);
    assert_eq!(deployment.sentinels().len(), 3);
    assert_eq!(
        deployment.current_master_port(),
        Some(deployment.master().port())
    );

    deployment.master().kill();
    let replica = deployment.replicas()[0].port();
    let deadline = Instant::now() + Duration::from_secs(30);
    while deployment.current_master_port() != Some(replica) {
        assert!(Instant::now() < deadline, "no failover within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query(&mut deployment.replicas()[0].connection())
        .unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec())),
        "the replica was promoted"
    );
}

//! The rate limiter's tests: budgets across threads and processes, and bad
//! input. Child processes re-run this binary on `child_entry`.

#[path = "../support/mod.rs"]
mod support;

mod budgets;
mod errors;

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[budgets::run_child]);
}

/// Under `replica_acks`, a grant the replicas did not confirm is not a
/// grant: a failover to a replica that never saw the bucket drawn down
/// would grant the same permits again.
#[cfg(feature = "sentinel")]
#[test]
fn a_grant_no_replica_confirmed_is_not_replicated() {
    use std::time::Duration;

    use redbaton::{Error, RateMode};
    use support::{cut_replica, restore_replica, Deployment, Topology};

    let deployment = Deployment::start(Topology::Sentinel);
    let sentinels = deployment.sentinels();
    let client = deployment
        .builder()
        .replica_acks(1, Duration::from_millis(200))
        .build()
        .unwrap();
    let limiter = client.rate_limiter("confirmed").unwrap();
    limiter
        .set_rate(RateMode::Overall, 10, Duration::from_secs(1))
        .unwrap();
    assert!(limiter.try_acquire(1).unwrap(), "granted and confirmed");
    cut_replica(sentinels);
    let unconfirmed = limiter.try_acquire(1);
    assert!(
        matches!(unconfirmed, Err(Error::NotReplicated { .. })),
        "{unconfirmed:?}"
    );
    restore_replica(sentinels);
    assert!(limiter.try_acquire(1).unwrap(), "confirmed again");
}

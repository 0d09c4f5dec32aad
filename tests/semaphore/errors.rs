//! Bad input to the semaphore is an error, promptly, never a hang; damaged
//! keys are reported, not guessed at.

use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::support::client;
use crate::{place_a_waiter, sem_keys};
use redbaton::{Error, Semaphore, SemaphorePermit};
use testkit::RedisServer;

/// Every acquiring verb, asking for `permits`.
fn every_acquire(sem: &Semaphore, permits: u64) -> Vec<Result<Option<SemaphorePermit>, Error>> {
    let soon = Duration::from_secs(5);
    let mut results = vec![
        sem.acquire_many(permits).map(Some),
        sem.try_acquire_many(permits),
        sem.try_acquire_many_for(permits, soon),
        sem.try_acquire_many_for(permits, Duration::MAX),
        sem.try_acquire_many_until(permits, Instant::now() + soon),
    ];
    if permits == 1 {
        results.extend([
            sem.acquire().map(Some),
            sem.try_acquire(),
            sem.try_acquire_for(soon),
            sem.try_acquire_until(Instant::now() + soon),
        ]);
    }
    results
}

#[test]
fn zero_and_absurd_permit_counts_are_invalid_everywhere() {
    let server = RedisServer::start();
    let client = client(&server);
    let sem = client.semaphore("bad").unwrap();
    sem.try_set_permits(3).unwrap();
    let started = Instant::now();
    for permits in [0, 1_000_000_000_001, u64::MAX] {
        let mut errors: Vec<Error> = every_acquire(&sem, permits)
            .into_iter()
            .map(|result| result.unwrap_err())
            .collect();
        errors.extend([
            sem.try_set_permits(permits).unwrap_err(),
            sem.add_permits(permits).unwrap_err(),
            sem.reduce_permits(permits).unwrap_err(),
        ]);
        for err in errors {
            assert!(
                matches!(err, Error::InvalidPermits { permits: p } if p == permits),
                "{permits}: {err}"
            );
        }
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(sem.total_permits().unwrap(), 3, "nothing changed");
    assert_eq!(sem.available_permits().unwrap(), 3);
}

#[test]
fn adding_past_the_most_a_semaphore_holds_is_invalid_and_changes_nothing() {
    let server = RedisServer::start();
    let client = client(&server);
    let sem = client.semaphore("big").unwrap();
    assert_eq!(
        sem.try_set_permits(1_000_000_000_000).unwrap(),
        1_000_000_000_000
    );
    let err = sem.add_permits(1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidPermits {
                permits: 1_000_000_000_001
            }
        ),
        "{err}"
    );
    assert_eq!(sem.total_permits().unwrap(), 1_000_000_000_000);
    let all = sem.acquire_many(1_000_000_000_000).unwrap();
    assert_eq!(sem.available_permits().unwrap(), 0);
    all.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1_000_000_000_000);
}

across_topologies! { but_masters;
    /// More permits than the total is an error at once, from every verb,
    /// before any wait (and with no place left among the waiters).
    fn more_permits_than_the_total_is_an_error_before_waiting(deployment) {
        let client = deployment.client();
        let sem = client.semaphore("small").unwrap();
        sem.try_set_permits(2).unwrap();
        let started = Instant::now();
        for result in every_acquire(&sem, 3) {
            let err = result.unwrap_err();
            assert!(
                matches!(err, Error::PermitsOverCapacity { permits: 3, capacity: 2, ref name } if name == "small"),
                "{err}"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(2), "no waiting: {:?}", started.elapsed());
        let [_, _, _, waiters, ..] = sem_keys("small");
        let mut raw = deployment.server_for(&waiters).connection();
        let places: u32 = redis::cmd("ZCARD").arg(&waiters).query(&mut raw).unwrap();
        assert_eq!(places, 0);
        assert_eq!(sem.available_permits().unwrap(), 2);
    }
}

across_topologies! { but_masters;
    /// Before anyone sets a total, every verb but try_set_permits says so.
    fn a_semaphore_without_a_total_is_not_set(deployment) {
        let client = deployment.client();
        let sem = client.semaphore("unset").unwrap();
        let mut errors: Vec<Error> = every_acquire(&sem, 1)
            .into_iter()
            .map(|result| result.unwrap_err())
            .collect();
        errors.extend([
            sem.available_permits().unwrap_err(),
            sem.total_permits().unwrap_err(),
            sem.add_permits(1).unwrap_err(),
            sem.reduce_permits(1).unwrap_err(),
        ]);
        for err in errors {
            assert!(matches!(err, Error::SemaphoreNotSet { ref name } if name == "unset"), "{err}");
            assert!(err.to_string().contains("try_set_permits"), "{err}");
        }
        assert_eq!(sem.try_set_permits(1).unwrap(), 1);
        assert!(sem.try_acquire().unwrap().is_some());
    }
}

#[test]
fn zero_and_absurd_fixed_leases_are_invalid() {
    let client = redbaton::Client::open("redis://127.0.0.1:1/").unwrap();
    let sem = client.semaphore("leased").unwrap();
    for lease in [Duration::ZERO, Duration::from_micros(999), Duration::MAX] {
        let err = sem.with_fixed_lease(lease).unwrap_err();
        assert!(
            matches!(err, Error::InvalidLease { lease: l } if l == lease),
            "{err}"
        );
    }
    assert!(sem.with_fixed_lease(Duration::from_millis(1)).is_ok());
    assert!(matches!(
        client.semaphore("").unwrap_err(),
        Error::InvalidName { .. }
    ));
}

#[test]
fn a_damaged_key_is_a_wrong_type_error_and_is_left_alone() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut raw = server.connection();
    let names = ["state", "holders", "counts", "waiters", "baton"];
    // The reserved baton is read only while a waiter holds newcomers back:
    // a_wrong_typed_key_fails_acquire_and_release_before_any_write has it.
    for (index, key) in sem_keys("damaged").into_iter().take(5).enumerate() {
        let sem = client.semaphore("damaged").unwrap();
        redis::cmd("FLUSHALL").query::<()>(&mut raw).unwrap();
        if key.ends_with(":state") {
            // A state that is a hash, but not the semaphore's.
            redis::cmd("HSET")
                .arg(&key)
                .arg("total")
                .arg("many")
                .query::<()>(&mut raw)
                .unwrap();
        } else {
            redis::cmd("SET")
                .arg(&key)
                .arg("x")
                .query::<()>(&mut raw)
                .unwrap();
            sem.try_set_permits(2).unwrap_or(0);
        }
        if key.ends_with(":baton") {
            // The baton is read only while somebody waits (a call with
            // nobody to wake leaves it alone): a waiter's place.
            place_a_waiter(&mut raw, "damaged");
        }
        let errors = [
            sem.try_acquire().unwrap_err(),
            sem.try_acquire_for(Duration::from_secs(1)).unwrap_err(),
            sem.available_permits().unwrap_err(),
            sem.add_permits(1).unwrap_err(),
        ];
        for err in errors {
            assert!(
                matches!(err, Error::WrongType { ref name, .. } if name == "damaged"),
                "{}: {err}",
                names[index]
            );
        }
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut raw).unwrap();
        let expected = if index == 0 { "hash" } else { "string" };
        assert_eq!(kind, expected, "{} left alone", names[index]);
    }
}

/// Every key's type and stored value (`DUMP`), to show a failed call
/// changed none of them.
fn snapshot(raw: &mut redis::Connection, keys: &[String]) -> Vec<(String, Option<Vec<u8>>)> {
    keys.iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(key).query(raw).unwrap();
            let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(raw).unwrap();
            (kind, dump)
        })
        .collect()
}

/// acquire.lua and release.lua check no type up front: each key's first
/// read fails instead, before anything is written. With a holder, a
/// waiter a release or an acquisition would wake and that holds newcomers
/// back (so that the reserved baton is read), and a token in the baton,
/// each would write every other key (the holders, the counts, the state,
/// the baton) if it went on; a key of another type is its clear error,
/// naming the key, and leaves every key as it was.
#[test]
fn a_wrong_typed_key_fails_acquire_and_release_before_any_write() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut raw = server.connection();
    let keys = sem_keys("typed");
    let kinds = ["hash", "zset", "hash", "zset", "list", "list"];
    for (index, damaged) in keys.iter().enumerate() {
        redis::cmd("FLUSHALL").query::<()>(&mut raw).unwrap();
        let sem = client.semaphore("typed").unwrap();
        sem.try_set_permits(3).unwrap();
        let held = sem.try_acquire().unwrap().expect("a free permit");
        // A live waiter for one permit, which either call would wake, and
        // a token for it already.
        place_a_waiter(&mut raw, "typed");
        redis::cmd("HSET")
            .arg(&keys[0])
            .arg("reserved")
            .arg("1:another-waiter")
            .arg("reserved_end")
            .arg(i64::MAX / 4)
            .query::<()>(&mut raw)
            .unwrap();
        redis::cmd("RPUSH")
            .arg(&keys[4])
            .arg("ok")
            .query::<()>(&mut raw)
            .unwrap();
        redis::cmd("DEL")
            .arg(damaged)
            .query::<()>(&mut raw)
            .unwrap();
        redis::cmd("SET")
            .arg(damaged)
            .arg("x")
            .query::<()>(&mut raw)
            .unwrap();
        let before = snapshot(&mut raw, &keys);
        let errors = [
            sem.try_acquire().map(|p| p.is_some()).unwrap_err(),
            held.release().unwrap_err(),
        ];
        for err in errors {
            assert_eq!(
                snapshot(&mut raw, &keys),
                before,
                "{damaged}: every key left alone"
            );
            match err {
                Error::WrongType {
                    ref name,
                    ref detail,
                } => {
                    assert_eq!(name, "typed");
                    assert_eq!(
                        detail,
                        &format!(
                            "semaphore key {damaged} holds a string, not a {}",
                            kinds[index]
                        )
                    );
                }
                other => panic!("{damaged}: {other}"),
            }
        }
    }
}

/// A client of independent masters holds locks only: a semaphore's calls
/// say so.
#[cfg(feature = "redlock")]
#[test]
fn a_quorum_client_refuses_semaphores_as_the_wrong_topology() {
    let deployment = crate::support::Deployment::start(crate::support::Topology::Masters);
    let client = deployment.client();
    let sem = client.semaphore("quorum").unwrap();
    let errors = [
        sem.try_set_permits(1).unwrap_err(),
        sem.acquire().unwrap_err(),
        sem.try_acquire().unwrap_err(),
        sem.try_acquire_for(Duration::from_secs(5)).unwrap_err(),
        sem.available_permits().unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::WrongTopology { .. }), "{err}");
    }
}

/// The commands docs/security.md adds to the lock's ACL line for the
/// semaphore.
const SEMAPHORE_ACL: &str =
    "+hget +hvals +llen +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore";

/// The ACL line plus the semaphore's commands, as docs/security.md
/// states them: every call works under a user limited to them.
#[test]
fn everything_works_under_a_user_limited_to_the_documented_acl() {
    assert!(
        crate::support::security_page_says(SEMAPHORE_ACL),
        "docs/security.md lists {SEMAPHORE_ACL}"
    );
    // And what the operators' view of the holders needs besides.
    assert!(
        crate::support::security_page_says("`Client::semaphore_holders` needs `+hgetall`"),
        "docs/security.md names the holders' view's command"
    );
    let server = RedisServer::start();
    let url =
        crate::support::documented_acl_user(&server, "sem", &format!("{SEMAPHORE_ACL} +hgetall"));
    let client = redbaton::Client::builder(url)
        .default_lease(Duration::from_millis(300))
        .max_park(Duration::from_millis(200))
        .build()
        .unwrap();
    let sem = client.semaphore("acl").unwrap();
    assert_eq!(sem.try_set_permits(1).unwrap(), 1);
    let permit = sem.acquire().unwrap();
    assert_eq!(client.semaphore_holders("acl").unwrap().len(), 1);
    // A waiter that gives up (parks, then leaves its place), and one that
    // is woken by the release, while the watchdog renews.
    assert!(sem
        .try_acquire_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    let waiter = sem.clone();
    let handle = std::thread::spawn(move || {
        waiter
            .try_acquire_for(Duration::from_secs(5))
            .map(|p| p.is_some())
    });
    crate::support::eventually(Duration::from_secs(3), "a renewal", || {
        client.watchdog_stats().renewals >= 2
    });
    permit.release().unwrap();
    assert!(crate::support::JoinWithin::joined(handle).unwrap());
    assert_eq!(sem.add_permits(1).unwrap(), 2);
    assert_eq!(sem.reduce_permits(1).unwrap(), 1);
    assert_eq!(sem.available_permits().unwrap(), 1);
    assert_eq!(client.watchdog_stats().losses, 0);
}

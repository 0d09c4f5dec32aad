//! Bad input is an error, never a hang: names, leases, damaged keys, and a
//! deployment the read-write lock does not run on.

use std::time::Duration;

use redbaton::{Client, Error};

use crate::across_topologies;
use crate::rw_key;

#[test]
fn empty_and_overlong_names_are_invalid() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    for name in [String::new(), "x".repeat(4097)] {
        let err = client.rw_lock(&name).unwrap_err();
        assert!(matches!(err, Error::InvalidName { .. }), "{err}");
    }
    assert!(client.rw_lock(&"x".repeat(4096)).is_ok());
}

#[test]
fn zero_and_absurd_fixed_leases_are_invalid() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    let lock = client.rw_lock("leases").unwrap();
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(366 * 24 * 3600),
        Duration::MAX,
    ] {
        let err = lock.with_fixed_lease(lease).unwrap_err();
        assert!(
            matches!(err, Error::InvalidLease { lease: l } if l == lease),
            "{err}"
        );
    }
    assert!(lock.with_fixed_lease(Duration::from_millis(1)).is_ok());
}

across_topologies! {
    but_masters;
    /// A string under the write key, the readers key or the upgradable
    /// key is reported as `WrongType` by every call, and left as it is.
    fn a_string_under_the_write_or_readers_key_is_a_wrong_type_error(deployment) {
        let client = deployment.client();
        let lock = client.rw_lock("damaged").unwrap();
        for part in ["write", "readers", "upgradable"] {
            let key = rw_key("damaged", part);
            let mut raw = deployment.server_for(&key).connection();
            redis::cmd("SET").arg(&key).arg("not redbaton's").query::<()>(&mut raw).unwrap();
            let errors = [
                lock.read().map(drop).unwrap_err(),
                lock.try_read().map(drop).unwrap_err(),
                lock.try_read_for(Duration::from_secs(1)).map(drop).unwrap_err(),
                lock.write().map(drop).unwrap_err(),
                lock.try_write().map(drop).unwrap_err(),
                lock.try_write_for(Duration::from_secs(1)).map(drop).unwrap_err(),
                lock.upgradable_read().map(drop).unwrap_err(),
                lock.try_upgradable_read().map(drop).unwrap_err(),
                lock.try_upgradable_read_for(Duration::from_secs(1)).map(drop).unwrap_err(),
            ];
            for err in errors {
                assert!(matches!(&err, Error::WrongType { name, .. } if name == "damaged"), "{part}: {err:?}");
            }
            let value: String = redis::cmd("GET").arg(&key).query(&mut raw).unwrap();
            assert_eq!(value, "not redbaton's", "left alone");
            redis::cmd("DEL").arg(&key).query::<()>(&mut raw).unwrap();
        }
        lock.try_write().unwrap().expect("fine once the keys are clean").unlock().unwrap();
    }
}

#[cfg(feature = "redlock")]
#[test]
fn a_quorum_client_says_the_read_write_lock_needs_one_deployment() {
    let masters: Vec<_> = (0..3).map(|_| testkit::RedisServer::start()).collect();
    let client = Client::builder(redbaton::Topology::masters(
        masters.iter().map(testkit::RedisServer::url),
    ))
    .build()
    .unwrap();
    let lock = client.rw_lock("quorum").unwrap();
    let errors = [
        lock.read().map(drop).unwrap_err(),
        lock.try_read().map(drop).unwrap_err(),
        lock.write().map(drop).unwrap_err(),
        lock.try_write_for(Duration::from_secs(1))
            .map(drop)
            .unwrap_err(),
        lock.upgradable_read().map(drop).unwrap_err(),
        lock.try_upgradable_read_for(Duration::from_secs(1))
            .map(drop)
            .unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    }
}

/// Every key of read-write lock `name`: its type and stored value (`DUMP`),
/// to show a failed call changed none of them.
fn snapshot(raw: &mut redis::Connection, name: &str) -> Vec<(String, Option<Vec<u8>>)> {
    [
        "write",
        "readers",
        "depths",
        "writers",
        "rbaton",
        "wbaton",
        "fence",
        "upgradable",
        "ubaton",
        "upbaton",
    ]
    .iter()
    .map(|part| {
        let key = rw_key(name, part);
        let kind: String = redis::cmd("TYPE").arg(&key).query(raw).unwrap();
        let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(raw).unwrap();
        (kind, dump)
    })
    .collect()
}

/// The last release of a read or write hold checks the type of the batons
/// it pushes only, before its first write: with a writer waiting, a write
/// baton that is not a list fails the release, naming the key, and leaves
/// every key as it was; with nobody waiting, the release pushes nothing and
/// does not look at it.
#[test]
fn a_release_fails_on_a_damaged_baton_it_would_push_and_changes_nothing() {
    let server = testkit::RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let mut raw = server.connection();
    let wbaton = rw_key("batons", "wbaton");
    for kind in ["read", "write"] {
        redis::cmd("FLUSHALL").query::<()>(&mut raw).unwrap();
        let lock = client.rw_lock("batons").unwrap();
        redis::cmd("SET")
            .arg(&wbaton)
            .arg("x")
            .query::<()>(&mut raw)
            .unwrap();
        let unlock: Box<dyn FnOnce() -> Result<(), Error>> = if kind == "read" {
            let guard = lock.read().unwrap();
            Box::new(move || guard.unlock())
        } else {
            let guard = lock.write().unwrap();
            Box::new(move || guard.unlock())
        };
        // A writer waiting, whom the release would wake.
        redis::cmd("ZADD")
            .arg(rw_key("batons", "writers"))
            .arg(i64::MAX / 4)
            .arg("another-writer")
            .query::<()>(&mut raw)
            .unwrap();
        let before = snapshot(&mut raw, "batons");
        let err = unlock().unwrap_err();
        assert_eq!(
            snapshot(&mut raw, "batons"),
            before,
            "{kind}: every key left alone"
        );
        assert!(
            matches!(&err, Error::WrongType { name, detail } if name == "batons" && detail.contains(&wbaton)),
            "{kind}: {err:?}"
        );
        // Nobody waiting: nothing pushed, and the baton not looked at.
        redis::cmd("DEL")
            .arg(rw_key("batons", "writers"))
            .query::<()>(&mut raw)
            .unwrap();
        let held = if kind == "read" {
            lock.read().unwrap().unlock()
        } else {
            lock.write().unwrap().unlock()
        };
        held.unwrap();
        let value: String = redis::cmd("GET").arg(&wbaton).query(&mut raw).unwrap();
        assert_eq!(value, "x");
    }
}

/// The commands docs/security.md adds to the lock's ACL line for the
/// read-write lock.
const RW_ACL: &str =
    "+zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zcard +zscore +hget +hgetall";

/// The ACL line plus the read-write lock's commands, as docs/security.md
/// states them: a read-write lock works under a user limited to them
/// (reads and writes, a reader of another client waiting behind a write
/// and granted the read by its release, a writer waiting behind a read,
/// an upgradable read upgraded and downgraded, renewals).
#[test]
fn everything_works_under_a_user_limited_to_the_documented_acl() {
    use std::thread;

    use crate::support::{eventually, JoinWithin};

    assert!(
        crate::support::security_page_says(RW_ACL),
        "docs/security.md lists {RW_ACL}"
    );
    let server = testkit::RedisServer::start();
    let url = crate::support::documented_acl_user(&server, "rw", RW_ACL);
    let open = || {
        Client::builder(url.as_str())
            .default_lease(Duration::from_millis(300))
            .max_park(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let (client, other) = (open(), open());
    let rw = client.rw_lock("acl").unwrap();
    rw.write().unwrap().unlock().unwrap();
    rw.read().unwrap().unlock().unwrap();

    // A reader of another client behind a write, past a park.
    let write = rw.write().unwrap();
    let reader = other.rw_lock("acl").unwrap();
    let waiting = thread::spawn(move || {
        reader
            .try_read_for(Duration::from_secs(5))
            .map(|g| g.map(|g| g.unlock()).is_some())
    });
    eventually(Duration::from_secs(3), "renewals past a park", || {
        client.watchdog_stats().renewals >= 4
    });
    write.unlock().unwrap();
    assert!(waiting.joined().unwrap());

    // A writer of another client behind a read.
    let read = rw.read().unwrap();
    let writer = other.rw_lock("acl").unwrap();
    let waiting = thread::spawn(move || {
        writer
            .try_write_for(Duration::from_secs(5))
            .map(|g| g.map(|g| g.unlock()).is_some())
    });
    let mut admin = server.connection();
    eventually(Duration::from_secs(3), "the writer's place", || {
        redis::cmd("ZCARD")
            .arg(rw_key("acl", "writers"))
            .query::<u64>(&mut admin)
            .unwrap()
            == 1
    });
    read.unlock().unwrap();
    assert!(waiting.joined().unwrap());

    let upgradable = rw.upgradable_read().unwrap();
    let write = upgradable.upgrade().unwrap();
    write.unlock().unwrap();
    let upgradable = rw.upgradable_read().unwrap();
    upgradable.downgrade().unwrap().unlock().unwrap();
    assert_eq!(client.watchdog_stats().losses, 0);
}

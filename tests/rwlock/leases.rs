//! Leases: renewed holds outlive their lease while held; a fixed one ends
//! on time and its guard says so.

use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error};
use testkit::RedisServer;

use crate::support;

fn client_with_lease(server: &RedisServer, lease: Duration) -> Client {
    Client::builder(server.url())
        .default_lease(lease)
        .build()
        .unwrap()
}

#[test]
fn renewed_read_and_write_holds_outlive_their_lease_while_held() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(300);
    let client = client_with_lease(&server, lease);
    let other = support::client(&server);
    let (lock, theirs) = (
        client.rw_lock("renewed").unwrap(),
        other.rw_lock("renewed").unwrap(),
    );

    let read = lock.read().unwrap();
    thread::sleep(lease * 4);
    assert!(
        theirs.try_write().unwrap().is_none(),
        "the read hold lives on"
    );
    assert!(!read.is_lost());
    assert!(read.valid_until() > Instant::now());
    read.unlock().unwrap();

    let write = lock.write().unwrap();
    thread::sleep(lease * 4);
    assert!(
        theirs.try_read().unwrap().is_none(),
        "the write hold lives on"
    );
    assert!(!write.is_lost());
    assert!(write.valid_until() > Instant::now());
    write.unlock().unwrap();

    let stats = client.watchdog_stats();
    assert!(stats.renewals >= 4, "{stats:?}");
    assert_eq!(stats.losses, 0, "{stats:?}");
    theirs.try_write().unwrap().expect("free").unlock().unwrap();
}

#[test]
fn a_fixed_read_lease_ends_on_time_and_its_guard_reports_it_lost() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let other = support::client(&server);
    let fixed = client
        .rw_lock("fixed")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(300))
        .unwrap();
    let read = fixed.read().unwrap();
    let started = Instant::now();
    let write = other
        .rw_lock("fixed")
        .unwrap()
        .try_write_for(Duration::from_secs(5))
        .unwrap()
        .expect("the read hold ends with its lease");
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(200) && waited < Duration::from_millis(1_000),
        "{waited:?}"
    );
    assert!(read.is_lost());
    let err = read.unlock().unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(matches!(err, Error::LockLost { .. }));
    write.unlock().unwrap();
}

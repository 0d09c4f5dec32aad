//! Every bad input and Redis failure gets its own error, promptly.

use crate::across_topologies;
use crate::support;

use std::net::TcpListener;
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{baton_key, lock_key, JoinWithin};
use redbaton::{Client, Error};
use testkit::RedisServer;

#[test]
fn empty_name_is_invalid() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    let err = client.lock("").unwrap_err();
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
}

#[test]
fn zero_and_absurd_leases_are_invalid() {
    for lease in [Duration::ZERO, Duration::from_micros(999), Duration::MAX] {
        let err = Client::builder("redis://127.0.0.1/")
            .default_lease(lease)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidLease { lease: l } if l == lease),
            "{err}"
        );
    }
}

#[test]
fn fixed_leases_out_of_range_are_invalid() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    let lock = client.lock("leased").unwrap();
    for lease in [
        Duration::ZERO,
        Duration::MAX,
        Duration::from_secs(366 * 24 * 3600),
    ] {
        let err = lock.with_fixed_lease(lease).unwrap_err();
        assert!(matches!(err, Error::InvalidLease { .. }), "{err}");
    }
    assert!(lock.with_fixed_lease(Duration::from_millis(1)).is_ok());
}

#[test]
fn bad_settings_are_refused_by_build() {
    let cases = [
        Client::builder("redis://127.0.0.1/").prefix("a{b"),
        Client::builder("redis://127.0.0.1/").prefix(""),
        Client::builder("redis://127.0.0.1/").pool_size(0),
        Client::builder("redis://127.0.0.1/").parking_connections(0),
        // r2d2 reserves room for the whole pool up front: these aborted
        // the process before they were refused.
        Client::builder("redis://127.0.0.1/").pool_size(u32::MAX),
        Client::builder("redis://127.0.0.1/").parking_connections(u32::MAX),
        Client::builder("redis://127.0.0.1/").max_local_handoffs(u32::MAX),
        Client::builder("redis://127.0.0.1/").fence_counter_ttl(Duration::ZERO),
        Client::builder("redis://127.0.0.1/").max_park(Duration::ZERO),
        Client::builder("redis://127.0.0.1/").io_timeout(Duration::ZERO),
        Client::builder("redis://127.0.0.1/").baton_ttl(Duration::MAX),
    ];
    for builder in cases {
        let shown = format!("{builder:?}");
        let err = builder.build().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{shown}: {err}");
    }
}

#[test]
fn malformed_url_is_invalid_and_passwords_stay_out_of_debug() {
    let err = Client::open("not a url").unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");

    let builder = Client::builder("redis://user:s3cret@127.0.0.1:1/");
    assert!(!format!("{builder:?}").contains("s3cret"));
    let client = builder.build().unwrap();
    assert!(!format!("{client:?}").contains("s3cret"));
}

across_topologies! {
    fn a_string_under_the_lock_key_is_a_wrong_type_error_and_is_left_alone(deployment) {
        let client = deployment.client();
        // On every server that holds the key (a quorum's majority would
        // take the lock past one damaged master, as it should).
        let mut raws: Vec<_> = deployment
            .servers_for(&lock_key("typed"))
            .into_iter()
            .map(|server| server.connection())
            .collect();
        for raw in &mut raws {
            redis::cmd("SET")
                .arg(lock_key("typed"))
                .arg("not a lock")
                .query::<()>(raw)
                .unwrap();
        }
        let lock = client.lock("typed").unwrap();
        for result in [lock.try_lock().map(|g| g.is_some()), lock.force_unlock()] {
            let err = result.unwrap_err();
            assert!(
                matches!(err, Error::WrongType { ref name, .. } if name == "typed"),
                "{err}"
            );
        }
        for raw in &mut raws {
            let value: String = redis::cmd("GET")
                .arg(lock_key("typed"))
                .query(raw)
                .unwrap();
            assert_eq!(value, "not a lock");
        }
    }
}

across_topologies! {
    fn a_string_under_the_baton_key_fails_the_release_without_freeing_the_lock(deployment) {
        let client = deployment.client();
        let lock = client.lock("batonless").unwrap();
        let guard = lock.lock().unwrap();
        for server in deployment.servers_for(&lock_key("batonless")) {
            redis::cmd("SET")
                .arg(baton_key("batonless"))
                .arg("junk")
                .query::<()>(&mut server.connection())
                .unwrap();
        }
        // Someone asks for the lock, so the release must wake them.
        let other = deployment.client();
        let asker = other.lock("batonless").unwrap();
        let refused = thread::spawn(move || asker.try_lock().unwrap().is_none()).joined();
        assert!(refused);
        let err = guard.unlock().unwrap_err();
        assert!(matches!(err, Error::WrongType { .. }), "{err}");
        assert!(
            lock.is_locked().unwrap(),
            "no lock freed without its wake-up"
        );
    }
}

#[test]
fn nobody_listening_is_unreachable_within_the_io_timeout() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::builder(format!("redis://127.0.0.1:{port}/"))
        .io_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let lock = client.lock("nowhere").unwrap();
    let start = Instant::now();
    let err = lock.try_lock().unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn a_paused_server_is_unreachable_within_the_io_timeout() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.lock("stalled").unwrap();
    lock.lock().unwrap().unlock().unwrap(); // the pool holds a live connection
    let mut raw = server.connection();
    let own: i64 = redis::cmd("CLIENT").arg("ID").query(&mut raw).unwrap();
    let others = |raw: &mut redis::Connection| -> Vec<i64> {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(raw).unwrap();
        list.lines()
            .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
            .filter(|id| *id != own)
            .collect()
    };
    let pooled = others(&mut raw);
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    server.pause();
    let start = Instant::now();
    let err = lock.try_lock().unwrap_err();
    let took = start.elapsed();
    server.resume();
    assert!(err.is_unreachable() && err.is_timeout(), "{err}");
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
    // The timed-out connection was closed, not pooled (its late reply would
    // answer the next command), and the next call works on a new one.
    support::eventually(
        Duration::from_secs(2),
        "the timed-out connection to close",
        || !others(&mut raw).contains(&pooled[0]),
    );
    let guard = lock.try_lock().unwrap().expect("free after resume");
    guard.unlock().unwrap();
}

#[test]
fn an_exhausted_pool_is_a_pool_timeout() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .pool_size(1)
        .io_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let lock = client.lock("scarce").unwrap();
    assert!(!lock.is_locked().unwrap()); // one pooled connection, now idle
    let mut raw = server.connection();
    // Every command but this connection's stalls for 1.5 s: whichever
    // caller takes the one pooled connection keeps it that long.
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_500)
        .arg("ALL")
        .query::<()>(&mut raw)
        .unwrap();
    let start = Arc::new(Barrier::new(2));
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let (lock, start, tx) = (lock.clone(), Arc::clone(&start), tx.clone());
        thread::spawn(move || {
            start.wait();
            let began = Instant::now();
            let result = lock.is_locked();
            tx.send((result, began.elapsed())).unwrap();
        });
    }
    let outcomes: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    let timeouts: Vec<_> = outcomes
        .iter()
        .filter(|(result, _)| matches!(result, Err(Error::PoolTimeout { .. })))
        .collect();
    assert!(!timeouts.is_empty(), "{outcomes:?}");
    for (result, took) in &timeouts {
        assert!(result.as_ref().unwrap_err().is_timeout());
        assert!(*took < Duration::from_secs(1), "pool wait took {took:?}");
    }
}

#[test]
fn a_name_over_4096_bytes_is_invalid() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    assert!(client.lock(&"n".repeat(4096)).is_ok());
    let err = client.lock(&"n".repeat(4097)).unwrap_err();
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
    assert!(
        err.to_string().len() < 300,
        "the message does not repeat the name"
    );
}

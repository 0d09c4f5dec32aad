//! Redis Sentinel secured apart from its master: the sentinels and the
//! data servers each with or without a password of their own, as real
//! deployments have them. `Topology::sentinel_with_master_url` reaches
//! the master with settings of its own; `Topology::sentinel` keeps using
//! the first sentinel URL's, which fails there, with the error that says so.

use std::time::{Duration, Instant};

use redbaton::{Client, Error, Topology};
use testkit::{Passwords, RedisSentinels};

use crate::support::{JoinWithin, SERVICE};

fn deployment(data: Option<&str>, sentinels: Option<&str>) -> RedisSentinels {
    RedisSentinels::start_with_passwords(
        SERVICE,
        1,
        3,
        Passwords {
            data: data.map(str::to_owned),
            sentinels: sentinels.map(str::to_owned),
        },
    )
}

fn client(topology: Topology) -> Client {
    Client::builder(topology)
        .io_timeout(Duration::from_secs(2))
        .build()
        .expect("valid settings")
}

/// Locks, and a waiter of another client woken by the baton.
fn locks_and_hands_over(first: &Client, second: &Client, name: &str) {
    let held = first.lock(name).unwrap().lock().unwrap();
    let waiter = second.lock(name).unwrap();
    let waited = std::thread::spawn(move || {
        waiter
            .try_lock_for(Duration::from_secs(10))
            .unwrap()
            .map(|guard| guard.fencing_token())
    });
    let token = held.fencing_token();
    held.unlock().unwrap();
    assert!(waited.joined().expect("the waiter got the lock") > token);
}

#[test]
fn sentinels_without_a_password_in_front_of_a_master_with_one() {
    let sentinels = deployment(Some("data-secret"), None);
    let urls = sentinels.sentinel_urls();

    // The master reached with the first sentinel URL's (empty) password.
    let plain = client(Topology::sentinel(SERVICE, &urls));
    let err = plain.lock("secured").unwrap().try_lock().unwrap_err();
    assert!(
        matches!(err, Error::AuthenticationFailed { .. }),
        "without the master's password: {err}"
    );

    let master_url = "redis://:data-secret@master/";
    let (first, second) = (
        client(Topology::sentinel_with_master_url(
            SERVICE, &urls, master_url,
        )),
        client(Topology::sentinel_with_master_url(
            SERVICE, &urls, master_url,
        )),
    );
    locks_and_hands_over(&first, &second, "secured");

    // After a failover the new master (a replica with the same password)
    // is reached the same way.
    let old = sentinels.master().port();
    let mut sentinel = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    // A sentinel that has not yet seen the replica answer its INFO (it
    // asks every 10 s, then every second) refuses with NOGOODSLAVE.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(err) = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query::<()>(&mut sentinel)
    {
        assert!(Instant::now() < deadline, "no failover started: {err}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while sentinels.current_master_port() == Some(old) {
        assert!(Instant::now() < deadline, "no failover within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Until the client has seen `+switch-master` (and the old master is
    // demoted), a lock may still be taken on the old master, which stays
    // writable for a while (see docs/deployments.md): look until it is taken on
    // the new one, which needs the master URL's password.
    let lock = first.lock("after-failover").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = match lock.try_lock() {
            Ok(Some(held)) => held,
            Ok(None) => panic!("nobody holds it"),
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(err) => panic!("after the failover: {err}"),
        };
        let new_master = sentinels.current_master_port().unwrap();
        let server = [sentinels.master()]
            .into_iter()
            .chain(sentinels.replicas())
            .find(|server| server.port() == new_master)
            .expect("the new master is one of the deployment's servers");
        let on_new_master: bool = redis::cmd("EXISTS")
            .arg("redbaton:{after-failover}:lock")
            .query(&mut sentinels.data_connection(server))
            .unwrap();
        drop(held);
        if on_new_master {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never held on the new master, port {new_master}, within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sentinels_with_a_password_in_front_of_a_master_without_one() {
    let sentinels = deployment(None, Some("sentinel-secret"));
    let urls = sentinels.sentinel_urls();
    assert!(urls[0].contains("sentinel-secret"));

    // The master reached with the sentinels' password, which it has not.
    let plain = client(Topology::sentinel(SERVICE, &urls));
    let err = plain.lock("secured").unwrap().try_lock().unwrap_err();
    assert!(
        matches!(err, Error::AuthenticationFailed { .. }),
        "with the sentinels' password: {err}"
    );

    let master_url = "redis://master/";
    let (first, second) = (
        client(Topology::sentinel_with_master_url(
            SERVICE, &urls, master_url,
        )),
        client(Topology::sentinel_with_master_url(
            SERVICE, &urls, master_url,
        )),
    );
    locks_and_hands_over(&first, &second, "secured");

    // Sentinels that want a password and get none: a clear error too.
    let anonymous: Vec<String> = sentinels
        .sentinels()
        .iter()
        .map(testkit::RedisServer::url)
        .collect();
    let refused = client(Topology::sentinel_with_master_url(
        SERVICE, &anonymous, master_url,
    ));
    let err = refused.lock("secured").unwrap().try_lock().unwrap_err();
    assert!(
        matches!(err, Error::AuthenticationFailed { .. }),
        "sentinels without their password: {err}"
    );
    println!("sentinels without their password: {err}");
}

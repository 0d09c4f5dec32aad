//! A server that answers a connect with a refusal (issue 9, E2): the
//! error says what Redis said, at once, not "unreachable" after the whole
//! I/O timeout.

use crate::support;

use std::time::{Duration, Instant};

use redbaton::{Client, Error};
use testkit::RedisServer;

/// A client with a long I/O timeout, so that waiting it out would show.
fn patient_client(url: String) -> Client {
    Client::builder(url)
        .io_timeout(Duration::from_secs(3))
        .build()
        .unwrap()
}

fn quick_error(client: &Client) -> (Error, Duration) {
    let started = Instant::now();
    let err = client.lock("refused").unwrap().try_lock().unwrap_err();
    (err, started.elapsed())
}

#[test]
fn maxclients_reached_is_reported_as_such_at_once() {
    let server = RedisServer::start_with(&["--maxclients", "1"]);
    let _only_one = server.connection();
    let client = patient_client(server.url());
    let (err, took) = quick_error(&client);
    println!("{err} after {took:?}");
    assert!(matches!(err, Error::Refused { .. }), "{err}");
    assert!(err.to_string().contains("max number of clients"), "{err}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn a_database_index_out_of_range_is_reported_as_such_at_once() {
    let server = RedisServer::start();
    let client = patient_client(format!("redis://127.0.0.1:{}/99", server.port()));
    let (err, took) = quick_error(&client);
    println!("{err} after {took:?}");
    assert!(matches!(err, Error::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("DB index is out of range"),
        "{err}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn a_wrong_password_is_reported_at_once() {
    let server = RedisServer::start();
    let client = patient_client(format!("redis://nobody:wrong@127.0.0.1:{}/", server.port()));
    let (err, took) = quick_error(&client);
    println!("{err} after {took:?}");
    assert!(matches!(err, Error::AuthenticationFailed { .. }), "{err}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn a_damaged_identity_counter_is_named_with_what_to_do() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    for damage in [
        &["HSET", "redbaton:identity", "x", "1"][..],
        &["SET", "redbaton:identity", "abc"],
    ] {
        redis::cmd("DEL")
            .arg("redbaton:identity")
            .query::<()>(&mut raw)
            .unwrap();
        let mut cmd = redis::cmd(damage[0]);
        for arg in &damage[1..] {
            cmd.arg(*arg);
        }
        cmd.query::<()>(&mut raw).unwrap();
        // A fresh client (and thread) asks for a new identity.
        let client = support::client(&server);
        let err = std::thread::spawn(move || client.lock("any").unwrap().try_lock().unwrap_err())
            .join()
            .unwrap();
        let message = err.to_string();
        assert!(matches!(err, Error::DamagedKey { .. }), "{message}");
        assert!(
            message.contains("redbaton:identity") && message.contains("delete"),
            "{damage:?}: {message}"
        );
    }
}

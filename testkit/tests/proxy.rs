//! The fault proxy against a real server.

use std::time::Duration;

use testkit::{FaultProxy, RedisServer};

fn connect(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).unwrap();
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    conn
}

#[test]
fn a_dropped_reply_ran_on_the_server_and_the_client_sees_a_dropped_connection() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut conn = connect(&proxy.url());
    let before: i64 = redis::cmd("INCR").arg("n").query(&mut conn).unwrap();
    assert_eq!(before, 1);
    proxy.drop_reply_to(b"INCR");
    let lost = redis::cmd("INCR").arg("n").query::<i64>(&mut conn);
    let err = lost.expect_err("the reply was dropped");
    assert!(err.is_connection_dropped(), "{err:?}");
    assert!(!proxy.is_armed());
    assert_eq!(proxy.dropped_replies(), 1);
    let ran: i64 = redis::cmd("GET")
        .arg("n")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(ran, 2, "the command whose reply was lost ran");
    // A new connection through the proxy works as before.
    let mut again = connect(&proxy.url());
    let n: i64 = redis::cmd("INCR").arg("n").query(&mut again).unwrap();
    assert_eq!(n, 3);
    assert_eq!(proxy.connections(), 2);
}

#[test]
fn a_silent_proxy_times_requests_out_and_reset_all_drops_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut conn = connect(&proxy.url());
    let mut quiet = connect(&proxy.url());
    proxy.set_silent(true);
    quiet
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let err = redis::cmd("PING").query::<String>(&mut quiet).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    proxy.set_silent(false);
    proxy.reset_all();
    let err = redis::cmd("PING").query::<String>(&mut conn).unwrap_err();
    assert!(err.is_connection_dropped(), "{err:?}");
}

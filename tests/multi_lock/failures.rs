//! A set's request whose reply is lost or late: nothing stays held by
//! nobody's guard.

use std::time::Duration;

use redbaton::Client;
use testkit::{FaultProxy, RedisServer};

use crate::support::eventually;

/// The reply of the set's script is lost on its way back: the transport
/// sends it again on a fresh connection, and the guard it returns holds
/// exactly what Redis says (the second run's tokens), all released after.
#[test]
fn a_lost_reply_is_sent_again_and_the_guard_matches_redis() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let observer = crate::support::client(&server);
    let set = client.multi_lock(["lost-a", "lost-b"]).unwrap();
    proxy.drop_reply_to(b"lost-a");
    let guard = set.lock().unwrap();
    assert_eq!(proxy.dropped_replies(), 1);
    for name in ["lost-a", "lost-b"] {
        let holder = observer.lock(name).unwrap().holder().unwrap().unwrap();
        assert_eq!(Some(holder.fencing_token), guard.fencing_token(name));
        assert_eq!(holder.depth, 1);
    }
    guard.unlock().unwrap();
    for name in ["lost-a", "lost-b"] {
        assert!(observer.lock(name).unwrap().holder().unwrap().is_none());
    }
}

/// The set's script runs after its caller gave up on the reply (a
/// timeout): the names it took are undone in the background as soon as
/// Redis answers, not left until their lease ends (30 s).
#[test]
fn a_late_reply_is_undone_in_the_background() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = Client::builder(proxy.url())
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let observer = crate::support::client(&server);
    let set = client.multi_lock(["late-x", "late-y"]).unwrap();
    set.lock().unwrap().unlock().unwrap(); // identity, scripts, connections
    proxy.set_delay(Duration::from_millis(700));
    let failed = set.try_lock();
    assert!(
        matches!(&failed, Err(err) if err.is_timeout()),
        "{failed:?}"
    );
    // The script did run, late.
    eventually(Duration::from_secs(5), "the late script runs", || {
        observer.lock("late-x").unwrap().is_locked().unwrap()
    });
    proxy.set_delay(Duration::ZERO);
    eventually(Duration::from_secs(5), "both names undone", || {
        ["late-x", "late-y"]
            .iter()
            .all(|name| !observer.lock(name).unwrap().is_locked().unwrap())
    });
}

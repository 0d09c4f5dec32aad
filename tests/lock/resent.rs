//! A release or hand-off sent twice: the transport sends a script again on
//! a fresh connection when the first one's reply was lost (it may have
//! run). The second run must change nothing, also when another client's
//! request ran in between. Checked with the crate's own scripts sent twice
//! by hand (`EVALSHA`), and end to end through a proxy that loses one
//! reply (`testkit::FaultProxy`).

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::scripts::{fence_key, script, BATON_TTL_MS, FENCE_TTL_MS, LEASE_MS};
use crate::support::{baton_key, eventually, is_asleep, lock_key, parked, thread_id, JoinWithin};
use redbaton::Client;
use testkit::{FaultProxy, RedisServer};

/// `lock/acquire.lua` for `id` as request `request`: `[1, fence, depth]` or
/// `[0, pttl]`.
fn acquire(raw: &mut redis::Connection, name: &str, id: &str, request: u64) -> Vec<i64> {
    script("acquire")
        .key(lock_key(name))
        .key(fence_key(name))
        .arg(id)
        .arg(LEASE_MS)
        .arg(0)
        .arg(1)
        .arg(FENCE_TTL_MS)
        .arg(request)
        .arg(0)
        .arg(0)
        .invoke(raw)
        .unwrap()
}

/// `lock/release.lua`: the last release of `id`'s ownership `fence`.
fn release(raw: &mut redis::Connection, name: &str, id: &str, fence: i64) -> i64 {
    script("release")
        .key(lock_key(name))
        .key(baton_key(name))
        .arg(id)
        .arg(fence)
        .arg(0)
        .arg(LEASE_MS)
        .arg(BATON_TTL_MS)
        .invoke(raw)
        .unwrap()
}

/// `lock/handoff.lua`: `from`'s ownership `fence` to `to`, as request
/// `request`.
fn handoff(
    raw: &mut redis::Connection,
    name: &str,
    from: &str,
    fence: i64,
    to: &str,
    request: u64,
) -> i64 {
    script("handoff")
        .key(lock_key(name))
        .key(fence_key(name))
        .arg(from)
        .arg(fence)
        .arg(to)
        .arg(LEASE_MS)
        .arg(FENCE_TTL_MS)
        .arg(request)
        .arg(0)
        .invoke(raw)
        .unwrap()
}

fn ownership(raw: &mut redis::Connection, name: &str) -> Vec<(String, String)> {
    redis::cmd("HGETALL")
        .arg(lock_key(name))
        .query(raw)
        .unwrap()
}

#[test]
fn a_release_sent_twice_leaves_the_next_holder_alone() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = acquire(&mut raw, "twice", "holder:1", 1)[1];
    assert_eq!(acquire(&mut raw, "twice", "other:1", 1)[0], 0, "held");
    assert_eq!(release(&mut raw, "twice", "holder:1", fence), 0);
    // Between the two sends, the other client takes the lock.
    assert_eq!(acquire(&mut raw, "twice", "other:1", 2)[0], 1);
    let between = ownership(&mut raw, "twice");
    assert_eq!(release(&mut raw, "twice", "holder:1", fence), -1);
    assert_eq!(
        ownership(&mut raw, "twice"),
        between,
        "the resend freed the next holder"
    );
    let batons: u64 = redis::cmd("LLEN")
        .arg(baton_key("twice"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(batons, 1, "one release, one baton");
}

#[test]
fn a_hand_off_sent_twice_hands_over_once() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = acquire(&mut raw, "pass", "holder:1", 1)[1];
    let handed = handoff(&mut raw, "pass", "holder:1", fence, "waiter:1", 5);
    assert!(handed > fence);
    // Between the two sends, another client asks for the lock.
    assert_eq!(
        acquire(&mut raw, "pass", "other:1", 1)[0],
        0,
        "held by the waiter"
    );
    let between = ownership(&mut raw, "pass");
    assert_eq!(
        handoff(&mut raw, "pass", "holder:1", fence, "waiter:1", 5),
        -1
    );
    assert_eq!(ownership(&mut raw, "pass"), between, "handed over twice");
    let counter: i64 = redis::cmd("GET")
        .arg(fence_key("pass"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(counter, handed, "a second fencing token was issued");
}

#[test]
fn a_release_whose_reply_was_lost_succeeds_once_though_another_client_took_the_lock_before_the_resend(
) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = client.lock("lost-release").unwrap();
    lock.try_lock().unwrap().expect("free").unlock().unwrap(); // scripts loaded
    let (held, wait_held) = mpsc::channel();
    let (go, wait_go) = mpsc::channel::<()>();
    let releaser = thread::spawn(move || {
        let guard = lock.lock().unwrap();
        held.send(()).unwrap();
        wait_go.recv_timeout(Duration::from_secs(30)).unwrap();
        guard.unlock()
    });
    wait_held.recv_timeout(Duration::from_secs(10)).unwrap();
    // 300 ms per request through the proxy: room for the other client
    // between the first run and the resend.
    proxy.set_delay(Duration::from_millis(300));
    proxy.drop_reply_to(b"EVALSHA");
    go.send(()).unwrap();
    eventually(Duration::from_secs(10), "the release's reply lost", || {
        proxy.dropped_replies() == 1
    });
    let other = Client::open(&server.url()).unwrap();
    let other_lock = other.lock("lost-release").unwrap();
    let taken = other_lock
        .try_lock()
        .unwrap()
        .expect("the first run released");
    let mut raw = server.connection();
    let between = ownership(&mut raw, "lost-release");
    releaser.joined().expect("the resend reports the release");
    proxy.set_delay(Duration::ZERO);
    assert_eq!(
        ownership(&mut raw, "lost-release"),
        between,
        "the resend freed the next holder"
    );
    taken.unlock().unwrap();
    assert_eq!(other_lock.holder().unwrap(), None);
}

#[test]
fn a_hand_off_whose_reply_was_lost_still_serves_both_waiters_at_once() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    // Parks that only a baton ends: nothing but the hand-off sends a
    // script meanwhile.
    let client = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(5))
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    // The hand-off script loaded, so that the reply lost is that of a
    // hand-off that ran, not a NOSCRIPT.
    let mut raw = server.connection();
    let _: String = script("handoff").prepare_invoke().load(&mut raw).unwrap();
    // A fixed lease: the hand-off goes through Redis (a renewed one passes
    // in memory).
    let lock = client
        .lock("lost-handoff")
        .unwrap()
        .with_fixed_lease(Duration::from_secs(30))
        .unwrap();
    let held = lock.lock().unwrap();
    let first_fence = held.fencing_token();
    let (ready, queued) = mpsc::channel();
    let (done, finished) = mpsc::channel();
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let (lock, ready, done) = (lock.clone(), ready.clone(), done.clone());
            let waiter = thread::spawn(move || {
                assert!(lock.try_lock().unwrap().is_none());
                ready.send(thread_id()).unwrap();
                let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
                done.send((i, guard.as_ref().map(|g| g.fencing_token())))
                    .unwrap();
            });
            // The first parks in Redis; the second waits in the process's
            // queue, and is the one handed the lock.
            let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
            if i == 0 {
                eventually(Duration::from_secs(10), "the first waiter parked", || {
                    parked(&server) == 1
                });
            } else {
                eventually(Duration::from_secs(10), "the second waiter queued", || {
                    is_asleep(tid)
                });
            }
            waiter
        })
        .collect();
    proxy.drop_reply_to(b"EVALSHA");
    held.unlock()
        .expect("the resent hand-off is not a lost lock");
    assert_eq!(proxy.dropped_replies(), 1);
    // The queued waiter finds the lock under its identity and takes it
    // afresh; its release wakes the parked one.
    let mut served = Vec::new();
    for _ in 0..2 {
        let (i, fence) = finished
            .recv_timeout(Duration::from_secs(5))
            .expect("served at once");
        served.push(i);
        assert!(fence.expect("got the lock") > first_fence);
    }
    assert_eq!(served, [1, 0]);
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(lock.holder().unwrap(), None);
}

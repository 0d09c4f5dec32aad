//! A Redlock quorum whose one master misses a release, a hand-off or an
//! undo (its requests held back by a proxy, or its reply lost): the copy
//! left there is cleared in the background as soon as that master answers
//! again, not when its lease ends. Waiters parked on that master would
//! otherwise hear no baton until then.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redbaton::{Client, Topology};
use testkit::{FaultProxy, RedisServer};

use crate::support::{eventually, is_asleep, lock_key, thread_id, JoinWithin};

/// Far longer than any wait below: a copy gone within the waits was
/// cleared, not expired.
const LEASE: Duration = Duration::from_secs(30);

/// Three masters, the first behind a proxy, and a client of them whose
/// rounds give up on a silent master quickly.
struct Quorum {
    masters: Vec<RedisServer>,
    proxy: FaultProxy,
    client: Client,
}

impl Quorum {
    fn start() -> Quorum {
        let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let proxy = FaultProxy::start(masters[0].port());
        let urls = [proxy.url(), masters[1].url(), masters[2].url()];
        let client = Client::builder(Topology::masters(&urls))
            .default_lease(LEASE)
            .node_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        Quorum {
            masters,
            proxy,
            client,
        }
    }

    /// Whether the first master has a copy of lock `name`.
    fn first_has(&self, name: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(lock_key(name))
            .query(&mut self.masters[0].connection())
            .unwrap()
    }
}

/// A last release that the first master never received is released on a
/// majority (`unlock` is `Ok`), and reaches the first master once it
/// answers again.
#[test]
fn a_release_one_master_missed_reaches_it_once_it_answers() {
    let quorum = Quorum::start();
    let guard = quorum.client.lock("part").unwrap().lock().unwrap();
    assert!(quorum.first_has("part"));
    quorum.proxy.set_silent(true);
    guard.unlock().expect("released on a majority");
    assert!(quorum.first_has("part"), "the first master heard nothing");
    quorum.proxy.set_silent(false);
    eventually(
        Duration::from_secs(3),
        "the release re-sent to the first master",
        || !quorum.first_has("part"),
    );
}

/// A local hand-off that the first master never received: the waiter gets
/// the lock from the majority, and the giver's copy on the first master is
/// released there once it answers (the waiter's copies stay).
#[test]
fn a_hand_off_one_master_missed_clears_the_givers_copy_there() {
    let quorum = Quorum::start();
    let lock = quorum.client.lock("given").unwrap();
    let held = lock.lock().unwrap();
    // Two waiters: the first parks in Redis, the second queues in this
    // process and is the one the lock is handed to.
    let (ready, queued) = mpsc::channel();
    let (got, acquired) = mpsc::channel();
    let (stop, release) = mpsc::channel::<()>();
    let release = std::sync::Arc::new(std::sync::Mutex::new(release));
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let (lock, ready, got) = (lock.clone(), ready.clone(), got.clone());
        let release = std::sync::Arc::clone(&release);
        waiters.push(thread::spawn(move || {
            assert!(lock.try_lock().unwrap().is_none());
            ready.send(thread_id()).unwrap();
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .unwrap()
                .expect("acquired");
            got.send(()).unwrap();
            // Hold until the test has looked.
            let _ = release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(20));
            drop(guard);
        }));
        let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
        eventually(Duration::from_secs(10), "the waiter asleep", || {
            is_asleep(tid)
        });
    }
    quorum.proxy.set_silent(true);
    held.unlock().expect("handed over on a majority");
    acquired
        .recv_timeout(Duration::from_secs(10))
        .expect("the local waiter got the lock");
    assert!(
        quorum.first_has("given"),
        "the giver's copy stands on the first master"
    );
    quorum.proxy.set_silent(false);
    eventually(
        Duration::from_secs(3),
        "the giver's copy released on the first master",
        || !quorum.first_has("given"),
    );
    let holder = quorum.client.lock("given").unwrap().holder().unwrap();
    assert!(
        holder.is_some(),
        "the waiter still holds it on the majority"
    );
    for _ in 0..2 {
        stop.send(()).unwrap();
    }
    for waiter in waiters {
        waiter.joined();
    }
}

/// A waiter's round that the first master granted (its reply lost) while
/// the others found the lock held: the grant is undone there as soon as
/// the first master answers again, and the caller hears of the failure
/// rather than a plain "held".
#[test]
fn a_grant_whose_reply_was_lost_is_undone_once_the_master_answers() {
    let quorum = Quorum::start();
    let urls: Vec<String> = quorum.masters.iter().map(RedisServer::url).collect();
    let holder = Client::builder(Topology::masters(&urls))
        .default_lease(LEASE)
        .build()
        .unwrap();
    let guard = holder.lock("lost").unwrap().lock().unwrap();
    // The first master lost the holder's copy (restarted empty, say).
    redis::cmd("DEL")
        .arg(lock_key("lost"))
        .query::<()>(&mut quorum.masters[0].connection())
        .unwrap();
    let lock = quorum.client.lock("lost").unwrap();
    // Scripts loaded and connections open, so that the reply lost below
    // is the acquisition's own.
    quorum
        .client
        .lock("warm")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    quorum.proxy.drop_reply_to(b"EVALSHA");
    let err = lock.try_lock().expect_err("a master failed mid-round");
    assert!(err.is_transient(), "{err}");
    assert_eq!(quorum.proxy.dropped_replies(), 1);
    eventually(
        Duration::from_secs(3),
        "the lost grant undone on the first master",
        || !quorum.first_has("lost"),
    );
    assert!(
        holder.lock("lost").unwrap().holder().unwrap().is_some(),
        "the holder keeps the majority"
    );
    guard.unlock().unwrap();
}

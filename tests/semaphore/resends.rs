//! A request sent twice (the transport sends a script again when its
//! connection dropped before the reply) takes effect once, whatever ran in
//! between: adjustments, acquisitions, releases. Each is sent twice by
//! hand (the crate's own script source, which Redis runs by the same hash),
//! and through a proxy that loses the reply after the script ran.

use std::thread;
use std::time::Duration;

use redbaton::{Client, Error};
use testkit::{FaultProxy, RedisServer};

use crate::sem_keys;
use crate::support::{self, JoinWithin};

/// The helpers every semaphore script is sent with, then the script.
macro_rules! sem_script {
    ($file:literal) => {
        concat!(
            include_str!("../../src/scripts/lib/permits.lua"),
            include_str!(concat!("../../src/scripts/semaphore/", $file))
        )
    };
}

const ADJUST: &str = sem_script!("adjust.lua");
pub(crate) const ACQUIRE: &str = sem_script!("acquire.lua");
/// The release grants, so the grant's message comes first (as the crate
/// sends it).
pub(crate) const RELEASE: &str = concat!(
    include_str!("../../src/scripts/lib/grant_message.lua"),
    sem_script!("release.lua")
);

/// The hash the crate sends `source` by: what the proxy watches for.
fn sha(source: &str) -> String {
    redis::Script::new(source).get_hash().to_owned()
}

/// The key of semaphore `name` that remembers recent adjustments.
fn adjusted_key(name: &str) -> String {
    format!("redbaton:{{{}}}:sem:adjusted", support::hash_tag(name))
}

/// adjust.lua by hand: `way` ("add" or "reduce") `n` under request `id`.
fn adjust(raw: &mut redis::Connection, name: &str, way: &str, n: u64, id: &str) -> Vec<i64> {
    redis::cmd("EVAL")
        .arg(ADJUST)
        .arg(7)
        .arg(&sem_keys(name))
        .arg(adjusted_key(name))
        .arg(way)
        .arg(n)
        .arg(id)
        .arg(5_000)
        .arg(300_000)
        .query(raw)
        .unwrap()
}

/// The case by hand: total 5; P's add runs; another client's
/// reduction runs; P's add arrives again: 5, not 6. And the other way
/// round for a reduction.
#[test]
fn an_adjustment_sent_twice_is_applied_once_whatever_ran_in_between() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let sem = client.semaphore("adjusted").unwrap();
    assert_eq!(sem.try_set_permits(5).unwrap(), 5);
    let mut raw = server.connection();
    assert_eq!(adjust(&mut raw, "adjusted", "add", 1, "p:1"), [1, 6]);
    assert_eq!(sem.reduce_permits(1).unwrap(), 5, "another client's");
    assert_eq!(adjust(&mut raw, "adjusted", "add", 1, "p:1"), [1, 5]);
    assert_eq!(sem.total_permits().unwrap(), 5, "the add applied twice");
    assert_eq!(adjust(&mut raw, "adjusted", "reduce", 2, "p:2"), [1, 3]);
    assert_eq!(sem.add_permits(2).unwrap(), 5);
    assert_eq!(sem.add_permits(1).unwrap(), 6);
    assert_eq!(adjust(&mut raw, "adjusted", "reduce", 2, "p:2"), [1, 6]);
    assert_eq!(
        sem.total_permits().unwrap(),
        6,
        "the reduction applied twice"
    );
    // Remembered for a while, not for ever.
    let ttl: i64 = redis::cmd("PTTL")
        .arg(adjusted_key("adjusted"))
        .query(&mut raw)
        .unwrap();
    assert!(ttl > 200_000 && ttl <= 300_000, "PTTL {ttl}");
}

/// Through the proxy: P's add runs and its reply is lost; while its resend
/// is held up, another client reduces; the resend is not applied again.
#[test]
fn an_adjustment_whose_reply_was_lost_is_applied_once_though_another_ran_in_between() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let p = Client::open(proxy.url().as_str()).unwrap();
    let other = support::client(&server);
    let sem = other.semaphore("lost-add").unwrap();
    sem.try_set_permits(4).unwrap();
    let adding = p.semaphore("lost-add").unwrap();
    // Loads the script: the request that loses its reply is one that runs.
    assert_eq!(adding.add_permits(1).unwrap(), 5);
    proxy.drop_reply_to(sha(ADJUST).as_bytes());
    proxy.set_delay(Duration::from_millis(300));
    let add = thread::spawn(move || adding.add_permits(1));
    support::eventually(Duration::from_secs(10), "the lost reply", || {
        proxy.dropped_replies() == 1
    });
    assert_eq!(sem.reduce_permits(1).unwrap(), 5, "after P's add ran");
    assert_eq!(add.joined().unwrap(), 5, "the resend's answer");
    assert_eq!(
        sem.total_permits().unwrap(),
        5,
        "expected 5: the add counted once"
    );
}

/// acquire.lua sent twice under one permit id holds its permits once, and
/// an acquisition whose reply was lost takes one permit, not two.
#[test]
fn an_acquisition_sent_twice_holds_its_permits_once() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let sem = client.semaphore("taken").unwrap();
    sem.try_set_permits(3).unwrap();
    let mut raw = server.connection();
    let acquire = |raw: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("EVAL")
            .arg(ACQUIRE)
            .arg(6)
            .arg(&sem_keys("taken"))
            .arg("t:1")
            .arg(2)
            .arg(30_000)
            .arg("")
            .arg(1_000)
            .arg(5_000)
            .query(raw)
            .unwrap()
    };
    assert_eq!(acquire(&mut raw), [1, 2]);
    assert_eq!(acquire(&mut raw), [1, 2], "the same request, acquired");
    assert_eq!(sem.available_permits().unwrap(), 1, "held once");

    let proxy = FaultProxy::start(server.port());
    let p = Client::open(proxy.url().as_str()).unwrap();
    let through = p.semaphore("taken").unwrap();
    drop(through.try_acquire().unwrap().expect("one is free"));
    proxy.drop_reply_to(sha(ACQUIRE).as_bytes());
    let permit = through
        .try_acquire()
        .unwrap()
        .expect("acquired on the resend");
    assert_eq!(proxy.dropped_replies(), 1);
    assert_eq!(sem.available_permits().unwrap(), 0);
    permit.release().unwrap();
    assert_eq!(
        sem.available_permits().unwrap(),
        1,
        "one taken, one returned"
    );
}

/// release.lua sent twice returns the permits once: another holder's
/// permits stay counted; through the proxy, the release whose reply was
/// lost reports success and returns one permit.
#[test]
fn a_release_sent_twice_returns_the_permits_once() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let sem = client.semaphore("returned").unwrap();
    sem.try_set_permits(3).unwrap();
    let one = sem.acquire().unwrap();
    let two = sem.acquire_many(2).unwrap();
    let [_, holders, counts, ..] = sem_keys("returned");
    let mut raw = server.connection();
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(&holders)
        .arg(0)
        .arg(-1)
        .query(&mut raw)
        .unwrap();
    let id_of_one = ids
        .iter()
        .find(|id| {
            let k: u64 = redis::cmd("HGET")
                .arg(&counts)
                .arg(id.as_str())
                .query(&mut raw)
                .unwrap();
            k == 1
        })
        .unwrap()
        .clone();
    let release = |raw: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(6)
            .arg(&sem_keys("returned"))
            .arg(&id_of_one)
            .arg(5_000)
            .query(raw)
            .unwrap()
    };
    assert_eq!(release(&mut raw), [1, 1]);
    assert_eq!(release(&mut raw), [0], "the second finds nothing");
    assert_eq!(sem.available_permits().unwrap(), 1, "two still held");
    // Its guard learns that someone else released it.
    assert!(matches!(one.release(), Err(Error::PermitsLost { .. })));

    let proxy = FaultProxy::start(server.port());
    let p = Client::open(proxy.url().as_str()).unwrap();
    let through = p.semaphore("returned").unwrap();
    through.acquire().unwrap().release().unwrap();
    let permit = through.acquire().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 0);
    proxy.drop_reply_to(sha(RELEASE).as_bytes());
    permit.release().unwrap();
    assert_eq!(proxy.dropped_replies(), 1);
    assert_eq!(sem.available_permits().unwrap(), 1, "two still held");
    two.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 3);
}

//! Bookkeeping that key TTLs would otherwise hide: a served waiter's place,
//! a state rebuilt while permits are held, a renewal after a lease ended;
//! and how soon a release serves a parked waiter.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error};
use testkit::RedisServer;

use crate::support::{self, JoinWithin};
use crate::{place_a_waiter, sem_keys};

/// Places among the waiters now.
fn places(server: &RedisServer, name: &str) -> u64 {
    let [_, _, _, waiters, ..] = sem_keys(name);
    redis::cmd("ZCARD")
        .arg(&waiters)
        .query(&mut server.connection())
        .unwrap()
}

/// Three waiters, each a client of its own parked for up to 30 s, behind
/// one permit: each release serves the next within a second (a token, not
/// the end of a park), and a waiter that acquired leaves its place at once
/// (a place would otherwise live 30 s more).
#[test]
fn each_release_serves_a_parked_waiter_at_once_and_a_served_waiter_leaves_no_place() {
    const WAITERS: usize = 3;
    let server = RedisServer::start();
    let holder = support::client(&server);
    let sem = holder.semaphore("served").unwrap();
    sem.try_set_permits(1).unwrap();
    let first = sem.acquire().unwrap();
    let (tx, rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Arc::new(std::sync::Mutex::new(release_rx));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let client = Client::builder(server.url())
                .max_park(Duration::from_secs(30))
                .build()
                .unwrap();
            let (tx, release_rx) = (tx.clone(), std::sync::Arc::clone(&release_rx));
            thread::spawn(move || {
                let sem = client.semaphore("served").unwrap();
                let permit = sem
                    .try_acquire_for(Duration::from_secs(60))
                    .unwrap()
                    .expect("served");
                tx.send(Instant::now()).unwrap();
                // Held until the test says so.
                release_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(60))
                    .unwrap();
                permit.release().unwrap();
            })
        })
        .collect();
    support::eventually(Duration::from_secs(10), "every waiter placed", || {
        places(&server, "served") == WAITERS as u64
    });
    let mut released = Instant::now();
    first.release().unwrap();
    let mut gaps = Vec::new();
    for served in 1..=WAITERS {
        let at = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        gaps.push(at.duration_since(released));
        assert_eq!(
            places(&server, "served"),
            (WAITERS - served) as u64,
            "a served waiter's place is gone"
        );
        released = Instant::now();
        release_tx.send(()).unwrap();
    }
    println!("from a release to the next waiter served: {gaps:?}");
    for gap in &gaps {
        assert!(
            *gap < Duration::from_secs(1),
            "served {gap:?} after a release"
        );
    }
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(sem.available_permits().unwrap(), 1);
}

/// Hold 2 of 3, lose the state hash (`DEL`), set 3 again: the new state
/// counts what the live holders hold: 1 available, not 3.
#[test]
fn a_state_set_again_after_it_was_lost_counts_what_live_holders_hold() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let sem = client.semaphore("rebuilt").unwrap();
    sem.try_set_permits(3).unwrap();
    let two = sem.acquire_many(2).unwrap();
    let [state, ..] = sem_keys("rebuilt");
    redis::cmd("DEL")
        .arg(&state)
        .query::<()>(&mut server.connection())
        .unwrap();
    assert!(matches!(
        sem.available_permits(),
        Err(Error::SemaphoreNotSet { .. })
    ));
    assert_eq!(sem.try_set_permits(3).unwrap(), 3);
    assert_eq!(sem.available_permits().unwrap(), 1, "two are still held");
    assert!(sem.try_acquire_many(2).unwrap().is_none());
    two.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 3);
}

/// A permit whose fixed lease ended, not yet purged by any script: the
/// renewal script (sent by hand, as the watchdog would) refuses it and
/// leaves its lease's end where it was.
#[test]
fn renewal_never_brings_back_a_permit_whose_lease_ended() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let sem = client.semaphore("ended").unwrap();
    sem.try_set_permits(1).unwrap();
    let fixed = sem.with_fixed_lease(Duration::from_millis(200)).unwrap();
    let permit = fixed.acquire().unwrap();
    let [_, holders, ..] = sem_keys("ended");
    let mut raw = server.connection();
    let (id, ended): (String, i64) = {
        let entry: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(&holders)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query(&mut raw)
            .unwrap();
        entry[0].clone()
    };
    // Past the lease's end (creating the situation).
    thread::sleep(Duration::from_millis(400));
    let renewed: i64 = redis::cmd("EVAL")
        .arg(concat!(
            include_str!("../../src/scripts/lib/permits.lua"),
            include_str!("../../src/scripts/semaphore/renew.lua")
        ))
        .arg(1)
        .arg(&holders)
        .arg(&id)
        .arg(30_000)
        .query(&mut raw)
        .unwrap();
    assert_eq!(renewed, 0, "an ended lease is not renewed");
    let score: Option<i64> = redis::cmd("ZSCORE")
        .arg(&holders)
        .arg(&id)
        .query(&mut raw)
        .unwrap();
    assert_eq!(score, Some(ended), "its end stays where it was");
    assert_eq!(sem.available_permits().unwrap(), 1, "the permit returned");
    assert!(matches!(permit.release(), Err(Error::PermitsLost { .. })));
}

/// An acquisition and a release with nobody waiting are one script each,
/// and neither looks at the baton: nobody is there to be woken.
#[test]
fn an_uncontended_acquire_and_release_leave_the_baton_alone() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let sem = client.semaphore("alone").unwrap();
    sem.try_set_permits(2).unwrap();
    // Scripts loaded, the connection open.
    sem.acquire().unwrap().release().unwrap();
    let used = support::commands_of(&server, || sem.acquire().unwrap().release().unwrap());
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_eq!(used.get("llen"), None, "{used:?}");
    // With a waiter's place, the release reads the baton to wake it.
    place_a_waiter(&mut server.connection(), "alone");
    let permit = sem.acquire().unwrap();
    let used = support::commands_of(&server, || permit.release().unwrap());
    assert_eq!(used.get("llen"), Some(&1), "{used:?}");
}

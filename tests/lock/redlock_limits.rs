//! The safety limits of a Redlock quorum, staged with masters that do not
//! agree: slow ones (a delaying proxy in front of them), ones whose fencing
//! counters are ahead, ones that lost the key, a hash written by hand on a
//! minority. Fast masters that agree never reach these checks.

use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error, Topology};
use testkit::{FaultProxy, RedisServer};

use crate::support::{baton_key, eventually, hash_tag, lock_key, JoinWithin};

fn start_masters() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start()).collect()
}

fn fence_key(name: &str) -> String {
    format!("redbaton:{{{}}}:fence", hash_tag(name))
}

fn exists(master: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query(&mut master.connection())
        .unwrap()
}

fn set_counter(master: &RedisServer, name: &str, value: u64) {
    redis::cmd("SET")
        .arg(fence_key(name))
        .arg(value)
        .query::<()>(&mut master.connection())
        .unwrap();
}

/// Far above any token a clock issues (tokens are at least the masters'
/// clocks in µs: about 1.8 × 10^15 in 2026).
const HIGH: u64 = 5_000_000_000_000_000;

/// Every master grants, but the round took longer than the lease less the
/// drift allowance: the lock is not taken, and what the round took is
/// undone while the slow masters would still hold it.
#[test]
fn a_round_slower_than_the_validity_takes_nothing_even_with_every_grant() {
    let masters = start_masters();
    let proxies = [
        FaultProxy::start(masters[1].port()),
        FaultProxy::start(masters[2].port()),
    ];
    let urls = [masters[0].url(), proxies[0].url(), proxies[1].url()];
    let client = Client::builder(Topology::masters(&urls))
        // The slow masters answer in time: only validity is at stake.
        .node_timeout(Duration::from_secs(3))
        // Half the lease is drift allowance: 500 ms of validity at most.
        .clock_drift(0.5, Duration::ZERO)
        .build()
        .unwrap();
    let lease = Duration::from_secs(1);
    let lock = client
        .lock("slow")
        .unwrap()
        .with_fixed_lease(lease)
        .unwrap();
    // Fast masters: taken (and every connection opened).
    lock.try_lock().unwrap().expect("free").unlock().unwrap();
    // The undo's script loaded too, as the crate builds it: a master that
    // lacks it is sent it alone, which would time a slow master's reload.
    for master in &masters {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(concat!(
                include_str!("../../src/scripts/lib/baton.lua"),
                include_str!("../../src/scripts/lock/release_request.lua")
            ))
            .query::<String>(&mut master.connection())
            .unwrap();
    }

    let delay = Duration::from_millis(600);
    for proxy in &proxies {
        proxy.set_delay(delay);
    }
    let started = Instant::now();
    let taken = lock.try_lock().unwrap();
    let took = started.elapsed();
    assert!(
        taken.is_none(),
        "a round of {took:?} leaves no validity of {lease:?} less half of it"
    );
    // The slow masters took it about `delay` after the start, for the
    // lease: without the undo it would still be there.
    assert!(
        took < delay + lease - Duration::from_millis(100),
        "{took:?}"
    );
    for (index, master) in masters.iter().enumerate() {
        assert!(
            !exists(master, &lock_key("slow")),
            "left behind on master {index}"
        );
    }
    for proxy in &proxies {
        proxy.set_delay(Duration::ZERO);
    }
    assert!(lock.try_lock().unwrap().is_some(), "fast again: taken");
}

/// One master's counter is ahead, so the masters issue different tokens
/// and a second round must get a majority of counters to accept the
/// agreed one. When two counters move past it before that round reaches
/// them (as another proposal would), the acquisition fails and is undone
/// on every master; without the race it is granted with a token above
/// every counter.
#[test]
fn disagreeing_tokens_lock_only_when_a_majority_accepts_the_agreed_one() {
    let masters = start_masters();
    let proxies = [
        FaultProxy::start(masters[0].port()),
        FaultProxy::start(masters[1].port()),
    ];
    let urls = [proxies[0].url(), proxies[1].url(), masters[2].url()];
    let client = Client::builder(Topology::masters(&urls))
        .node_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let lock = client.lock("split").unwrap();
    lock.try_lock().unwrap().expect("free").unlock().unwrap();

    set_counter(&masters[2], "split", HIGH);
    for proxy in &proxies {
        proxy.set_delay(Duration::from_millis(300));
    }
    let racing = lock.clone();
    let attempt = thread::spawn(move || racing.try_lock().map(|g| g.map(|g| g.fencing_token())));
    // The first round has run on master 0: its second round (the agreed
    // token, HIGH + 2) is held up in the proxies; move both counters past
    // it first.
    eventually(Duration::from_secs(5), "the first round", || {
        exists(&masters[0], &lock_key("split"))
    });
    set_counter(&masters[0], "split", HIGH + 1000);
    set_counter(&masters[1], "split", HIGH + 1000);
    let result = attempt.joined();
    assert!(
        matches!(result, Err(Error::NoQuorum { .. })),
        "one counter of three accepted the agreed token: {result:?}"
    );
    for (index, master) in masters.iter().enumerate() {
        assert!(
            !exists(master, &lock_key("split")),
            "left behind on master {index}"
        );
    }

    // No race: the agreed token is above every counter, and every master
    // holds it.
    for proxy in &proxies {
        proxy.set_delay(Duration::ZERO);
    }
    let guard = lock.try_lock().unwrap().expect("free");
    let token = guard.fencing_token();
    assert!(token > HIGH + 1000, "{token}");
    for master in &masters {
        let stored: u64 = redis::cmd("HGET")
            .arg(lock_key("split"))
            .arg("fence")
            .query(&mut master.connection())
            .unwrap();
        assert_eq!(stored, token);
    }
    guard.unlock().unwrap();
}

/// A renewal that finds the ownership on one master of three reports the
/// guard lost at once, before its validity would have run out.
#[test]
fn a_renewal_that_reaches_a_minority_reports_the_guard_lost() {
    let masters = start_masters();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    // Renewed every second; valid about 3 s after each renewal.
    let client = Client::builder(Topology::masters(&urls))
        .default_lease(Duration::from_secs(3))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let guard = client.lock("minority").unwrap().lock().unwrap();
    let first = guard.valid_until();
    eventually(Duration::from_secs(5), "a renewal", || {
        guard.valid_until() > first
    });
    assert!(!guard.is_lost());
    for master in &masters[..2] {
        redis::cmd("DEL")
            .arg(lock_key("minority"))
            .query::<()>(&mut master.connection())
            .unwrap();
    }
    let valid_until = guard.valid_until();
    eventually(Duration::from_secs(5), "the guard lost", || guard.is_lost());
    let lost_at = Instant::now();
    assert!(
        lost_at < valid_until,
        "lost {:?} after its validity: by the clock, not by the renewal",
        lost_at - valid_until
    );
    assert!(guard.unlock().is_err());
}

/// The second round's script takes a token only when it is strictly above
/// the master's counter: equal would let two proposals of one token both
/// win.
#[test]
fn the_fence_adoption_script_refuses_a_token_equal_to_the_counter() {
    let masters = start_masters();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let client = Client::builder(Topology::masters(&urls)).build().unwrap();
    // A counter ahead on one master: the client agrees on a token in a
    // second round, loading the adoption script on every master.
    set_counter(&masters[2], "adopt", HIGH);
    let guard = client.lock("adopt").unwrap().lock().unwrap();
    assert!(guard.fencing_token() > HIGH);
    guard.unlock().unwrap();

    let source = include_str!("../../src/scripts/lock/adopt_fence.lua");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(&mut masters[0].connection())
        .unwrap();
    let mut conn = masters[1].connection();
    let loaded: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&sha)
        .query(&mut conn)
        .unwrap();
    assert_eq!(loaded, [true], "the crate ran this very script");

    let counter = HIGH + 50;
    set_counter(&masters[1], "adopt", counter);
    let mut adopt = |token: u64| -> (i64, u64) {
        let accepted: i64 = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(2)
            .arg(lock_key("adopt"))
            .arg(fence_key("adopt"))
            .arg("nobody:1")
            .arg(token)
            .arg(60_000)
            .query(&mut conn)
            .unwrap();
        let stored: u64 = redis::cmd("GET")
            .arg(fence_key("adopt"))
            .query(&mut conn)
            .unwrap();
        (accepted, stored)
    };
    assert_eq!(adopt(counter - 1), (0, counter), "below the counter");
    assert_eq!(adopt(counter), (0, counter), "equal to the counter");
    assert_eq!(adopt(counter + 1), (1, counter + 1), "above the counter");
}

/// An ownership on one master of three is no holder: `holder()` and
/// `is_locked()` say free, and the lock can be taken. On two it is.
#[test]
fn a_hash_on_one_master_of_three_is_no_holder() {
    let masters = start_masters();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let client = Client::builder(Topology::masters(&urls)).build().unwrap();
    let lock = client.lock("minority-hash").unwrap();
    let write = |master: &RedisServer| {
        redis::cmd("HSET")
            .arg(lock_key("minority-hash"))
            .arg("flag")
            .arg("someone-else:1")
            .arg("count")
            .arg(1)
            .arg("fence")
            .arg(7)
            .query::<()>(&mut master.connection())
            .unwrap();
        redis::cmd("PEXPIRE")
            .arg(lock_key("minority-hash"))
            .arg(60_000)
            .query::<()>(&mut master.connection())
            .unwrap();
    };
    write(&masters[0]);
    assert_eq!(lock.holder().unwrap(), None);
    assert!(!lock.is_locked().unwrap());
    lock.try_lock()
        .unwrap()
        .expect("free on a majority")
        .unlock()
        .unwrap();

    write(&masters[1]);
    let holder = lock.holder().unwrap().expect("held on a majority");
    assert_eq!(holder.owner.as_str(), "someone-else:1");
    assert_eq!(holder.fencing_token, 7);
    assert!(lock.is_locked().unwrap());
    assert!(lock.try_lock().unwrap().is_none());
}

/// A moment's foreign grant on master 0 (gone in 300 ms), so that
/// `holder` takes the lock on masters 1 and 2 only; returns its guard once
/// master 0 is free again: every later round there wins master 0 and
/// loses the quorum.
fn held_on_a_bare_majority(masters: &[RedisServer], holder: &Client) -> redbaton::LockGuard {
    let key = lock_key("bare");
    redis::pipe()
        .cmd("HSET")
        .arg(&key)
        .arg(&["flag", "intruder", "count", "1", "fence", "1", "req", "1"])
        .cmd("PEXPIRE")
        .arg(&key)
        .arg(300)
        .query::<()>(&mut masters[0].connection())
        .unwrap();
    let guard = holder.lock("bare").unwrap().lock().unwrap();
    assert!(exists(&masters[1], &key) && exists(&masters[2], &key));
    eventually(Duration::from_secs(5), "master 0 free again", || {
        !exists(&masters[0], &key)
    });
    guard
}

/// A round that loses to a holder undoes its grant on the master the
/// holder never had without a baton: a waiter parked there would only
/// lose the same round (the Redlock waiting storm).
#[test]
fn a_round_lost_to_a_holder_undoes_its_grant_without_waking_anyone() {
    let masters = start_masters();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let holder = Client::builder(Topology::masters(&urls)).build().unwrap();
    let _guard = held_on_a_bare_majority(&masters, &holder);
    let loser = Client::builder(Topology::masters(&urls)).build().unwrap();
    assert!(loser.lock("bare").unwrap().try_lock().unwrap().is_none());
    assert!(!exists(&masters[0], &lock_key("bare")), "undone");
    assert!(
        !exists(&masters[0], &baton_key("bare")),
        "a baton for nobody on master 0"
    );
}

/// ... unless another caller found that grant in its way meanwhile: that
/// caller may be parked behind it, and the undo wakes it.
#[test]
fn a_lost_round_whose_grant_another_caller_found_wakes_a_waiter_on_undo() {
    let masters = start_masters();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let holder = Client::builder(Topology::masters(&urls)).build().unwrap();
    let _guard = held_on_a_bare_majority(&masters, &holder);
    // The loser's requests take 300 ms each way in: its grant on master 0
    // stands that long before its undo arrives.
    let proxies: Vec<FaultProxy> = masters
        .iter()
        .map(|m| FaultProxy::start(m.port()))
        .collect();
    let slow: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let loser = Client::builder(Topology::masters(&slow))
        .node_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let lock = loser.lock("bare").unwrap();
    lock.is_locked().unwrap(); // connections opened
    for proxy in &proxies {
        proxy.set_delay(Duration::from_millis(300));
    }
    let losing = thread::spawn(move || lock.try_lock().unwrap().is_none());
    let key = lock_key("bare");
    eventually(
        Duration::from_secs(5),
        "the loser's grant on master 0",
        || exists(&masters[0], &key),
    );
    let seer = Client::builder(Topology::masters(&urls)).build().unwrap();
    assert!(seer.lock("bare").unwrap().try_lock().unwrap().is_none());
    assert!(losing.joined(), "lost to the holder");
    assert!(!exists(&masters[0], &key), "undone");
    assert!(
        exists(&masters[0], &baton_key("bare")),
        "the undo woke whoever found the grant in its way"
    );
}

/// A quorum on `masters` as a user each limits to the documented ACL line.
fn acl_quorum(masters: &[RedisServer]) -> Client {
    let urls: Vec<String> = masters
        .iter()
        .map(|master| crate::support::documented_acl_user(master, "locker", ""))
        .collect();
    Client::builder(Topology::masters(&urls)).build().unwrap()
}

/// A quorum's masters need nothing beyond the lock's ACL line
/// (docs/security.md), the second round that agrees on a token included.
#[test]
fn a_quorum_agrees_on_a_token_under_the_documented_acl() {
    let masters = start_masters();
    let client = acl_quorum(&masters);
    // A counter ahead on one master: the second round proposes a token.
    set_counter(&masters[2], "acl", HIGH);
    let guard = client.lock("acl").unwrap().lock().unwrap();
    assert!(guard.fencing_token() > HIGH);
    guard.unlock().unwrap();
}

/// Under the documented ACL (no `PING`), a master left out of the rounds
/// while it did not answer is used again once it does: the probe's `PING`,
/// refused, is an answer (it was probed for ever, every round a master
/// short).
#[test]
fn a_stopped_master_is_used_again_under_the_documented_acl() {
    let masters = start_masters();
    let client = acl_quorum(&masters);
    let lock = client.lock("probed").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    masters[1].pause();
    // The round that finds it stopped leaves it out of the next ones.
    lock.lock().unwrap().unlock().unwrap();
    masters[1].resume();
    eventually(Duration::from_secs(10), "the resumed master", || {
        let guard = lock.lock().unwrap();
        let stored: Option<u64> = redis::cmd("HGET")
            .arg(lock_key("probed"))
            .arg("fence")
            .query(&mut masters[1].connection())
            .unwrap();
        let used = stored == Some(guard.fencing_token());
        guard.unlock().unwrap();
        used
    });
}

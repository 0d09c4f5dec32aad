//! Single-process behaviour of one lock: re-entry, ownership, fencing,
//! deadlines, administration, and the scripts themselves.

use crate::across_topologies;
use crate::support;
use crate::support::{Deployment, Topology};

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::JoinWithin;
use crate::support::{baton_key, client, eventually, lock_key};
use redbaton::{Client, Error};
use testkit::RedisServer;

across_topologies! {
    fn reentered_lock_is_free_only_after_the_last_unlock(deployment) {
        let (server, client) = (deployment.server_for(&lock_key("reentry")), deployment.client());
        let lock = client.lock("reentry").unwrap();

        let first = lock.lock().unwrap();
        let second = lock.lock().unwrap();
        let third = lock.try_lock().unwrap().expect("the holder may re-enter");
        let mut raw = server.connection();
        let depth: u32 = redis::cmd("HGET")
            .arg(lock_key("reentry"))
            .arg("count")
            .query(&mut raw)
            .unwrap();
        assert_eq!(depth, 3);

        // Another thread tries after each unlock; it must stay out until the last.
        let (ask, asked) = mpsc::channel::<()>();
        let (tell, told) = mpsc::channel::<bool>();
        let other = {
            let lock = lock.clone();
            thread::spawn(move || {
                while asked.recv().is_ok() {
                    let got = lock.try_lock().unwrap();
                    tell.send(got.is_some()).unwrap();
                }
            })
        };
        let probe = || {
            ask.send(()).unwrap();
            told.recv_timeout(Duration::from_secs(5)).unwrap()
        };
        assert!(!probe(), "held at depth 3");
        third.unlock().unwrap();
        assert!(!probe(), "held at depth 2");
        drop(second);
        assert!(!probe(), "held at depth 1");
        first.unlock().unwrap();
        assert!(probe(), "free after the third unlock");
        drop(ask);
        other.joined();
    }
}

across_topologies! {
    fn fencing_tokens_increase_per_acquisition_and_stay_on_reentry(deployment) {
        let client = deployment.client();
        let lock = client.lock("fenced").unwrap();

        let mut last = 0;
        for round in 0..5 {
            // Alternate threads so that ownership really changes hands.
            let lock = lock.clone();
            let (outer, inner) = thread::spawn(move || {
                let outer = lock.lock().unwrap();
                let inner = lock.lock().unwrap();
                let tokens = (outer.fencing_token(), inner.fencing_token());
                drop(inner);
                outer.unlock().unwrap();
                tokens
            })
            .joined();
            assert_eq!(outer, inner, "re-entry keeps the token (round {round})");
            assert!(outer > last, "token {outer} after {last} (round {round})");
            last = outer;
        }
    }
}

#[test]
fn release_by_a_thread_that_no_longer_owns_the_lock_is_refused_and_changes_nothing() {
    let server = RedisServer::start();
    let short = client(&server);
    let lock = short
        .lock("stolen")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(300))
        .unwrap();
    let stale = lock.lock().unwrap();
    eventually(Duration::from_secs(3), "the lease to end", || {
        !lock.is_locked().unwrap()
    });

    // A new holder (another client, so another identity) takes it.
    let successor_client = client(&server);
    let successor_lock = successor_client.lock("stolen").unwrap();
    let successor = successor_lock
        .try_lock()
        .unwrap()
        .expect("the lock is free");
    let mut raw = server.connection();
    let before: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(lock_key("stolen"))
        .query(&mut raw)
        .unwrap();

    let err = stale.unlock().unwrap_err();
    assert!(
        matches!(err, Error::LockLost { ref name } if name == "stolen"),
        "{err}"
    );
    assert!(err.is_lost());

    let after: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(lock_key("stolen"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(before, after, "the successor's lock is untouched");
    assert!(successor.fencing_token() > 0);
    successor.unlock().unwrap();
    assert!(!successor_lock.is_locked().unwrap());
}

across_topologies! {
    fn try_lock_for_returns_none_after_its_deadline(deployment) {
        let client = deployment.client();
        let lock = client.lock("busy").unwrap();
        let _held = lock.lock().unwrap();

        let waiter = lock.clone();
        let (start, outcome) = thread::spawn(move || {
            let start = Instant::now();
            let got = waiter.try_lock_for(Duration::from_millis(500)).unwrap();
            (start.elapsed(), got.is_some())
        })
        .joined();
        assert!(!outcome, "the lock stayed held");
        assert!(
            start >= Duration::from_millis(500),
            "gave up early: {start:?}"
        );
        assert!(
            start < Duration::from_millis(900),
            "gave up late: {start:?}"
        );
    }
}

across_topologies! {
    fn zero_wait_is_one_attempt_and_huge_wait_is_no_deadline(deployment) {
        let client = deployment.client();
        let lock = client.lock("edges").unwrap();
        let held = lock.lock().unwrap();

        let other = lock.clone();
        let zero = thread::spawn(move || other.try_lock_for(Duration::ZERO).unwrap().is_some());
        assert!(!zero.joined());

        let other = lock.clone();
        let (done, finished) = mpsc::channel();
        let forever = thread::spawn(move || {
            let guard = other.try_lock_for(Duration::MAX).unwrap();
            done.send(guard.is_some()).unwrap();
        });
        held.unlock().unwrap();
        assert!(finished.recv_timeout(Duration::from_secs(5)).unwrap());
        forever.joined();
    }
}

#[test]
fn waiter_wakes_when_holder_releases() {
    let server = RedisServer::start();
    // A long maximum park: only the baton can wake the waiter quickly.
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.lock("baton").unwrap();
    let held = lock.lock().unwrap();

    let waiter = lock.clone();
    let (acquired, acquisitions) = mpsc::channel();
    let handle = thread::spawn(move || {
        let guard = waiter.lock().unwrap();
        acquired.send(Instant::now()).unwrap();
        drop(guard);
    });
    eventually(Duration::from_secs(5), "the waiter parks", || {
        support::parked(&server) == 1
    });
    let released = Instant::now();
    held.unlock().unwrap();
    let woke = acquisitions
        .recv_timeout(Duration::from_secs(5))
        .expect("woken by the baton");
    assert!(woke.duration_since(released) < Duration::from_millis(500));
    handle.joined();
}

across_topologies! {
    fn with_lock_returns_the_value_and_releases(deployment) {
        let client = deployment.client();
        let lock = client.lock("scoped").unwrap();
        let value = lock.with_lock(|| {
            assert!(lock.is_locked().unwrap());
            42
        });
        assert_eq!(value.unwrap(), 42);
        assert!(!lock.is_locked().unwrap());
    }
}

#[test]
fn force_unlock_removes_any_holder_and_wakes_a_waiter() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.lock("admin").unwrap();
    let held = lock.lock().unwrap();
    let _again = lock.lock().unwrap();

    let waiter = lock.clone();
    let (tx, rx) = mpsc::channel();
    let (looked, wait_looked) = mpsc::channel::<()>();
    let handle = thread::spawn(move || {
        let guard = waiter.lock().unwrap();
        tx.send(guard.fencing_token()).unwrap();
        // Keep holding until the test has looked.
        wait_looked.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(guard);
    });
    eventually(Duration::from_secs(5), "the waiter parks", || {
        support::parked(&server) == 1
    });
    let admin = support::client(&server).lock("admin").unwrap();
    assert!(admin.force_unlock().unwrap());
    let token = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the waiter was woken");
    assert!(token > held.fencing_token());
    assert!(held.unlock().unwrap_err().is_lost());
    looked.send(()).unwrap();
    handle.joined();
    assert!(!admin.force_unlock().unwrap(), "nothing left to remove");
}

across_topologies! {
    fn scripts_are_reloaded_after_script_flush(deployment) {
        let client = deployment.client();
        let lock = client.lock("flushed").unwrap();
        lock.lock().unwrap().unlock().unwrap();
        for server in deployment.servers_for(&lock_key("flushed")) {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query::<()>(&mut server.connection())
                .unwrap();
        }
        let guard = lock.lock().unwrap();
        assert!(lock.is_locked().unwrap());
        guard.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());
    }
}

#[test]
fn keys_of_one_lock_share_a_cluster_slot_for_any_name() {
    let server = RedisServer::start();
    // A cluster-enabled server answers CLUSTER KEYSLOT for the keys that the
    // lock really wrote on the plain one.
    let cluster = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let client = client(&server);
    let other = support::client(&server);
    let mut raw = server.connection();
    let mut cluster_raw = cluster.connection();
    let names = [
        "plain",
        "with:colons:and spaces",
        "{braced}",
        "}{",
        "a{b}c",
        "{}",
        "%7B",
        "emoji 🔒🦀",
        "nul\0byte",
    ];
    let mut first_slots = Vec::new();
    for name in names {
        redis::cmd("FLUSHALL").query::<()>(&mut raw).unwrap();
        let lock = client.lock(name).unwrap();
        let guard = lock.lock().unwrap();
        // Asked for while held, so that the release leaves a baton too.
        let asker = other.lock(name).unwrap();
        assert!(thread::spawn(move || asker.try_lock().unwrap().is_none()).joined());
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("redbaton:{*")
            .query(&mut raw)
            .unwrap();
        guard.unlock().unwrap();
        keys.extend(
            redis::cmd("KEYS")
                .arg("redbaton:{*")
                .query::<Vec<String>>(&mut raw)
                .unwrap(),
        );
        // The clients' name records are per client, not per lock.
        keys.retain(|key| !key.starts_with("redbaton:{redbaton:identity}:client:"));
        keys.sort();
        keys.dedup();
        assert_eq!(
            keys.len(),
            3,
            "{name:?}: lock, baton and fence keys, got {keys:?}"
        );
        let slots: Vec<i64> = keys
            .iter()
            .map(|key| {
                redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query(&mut cluster_raw)
                    .unwrap()
            })
            .collect();
        assert!(
            slots.windows(2).all(|w| w[0] == w[1]),
            "{name:?}: {keys:?} in slots {slots:?}"
        );
        first_slots.push(slots[0]);
    }
    // The name decides the slot, so locks spread over a cluster.
    first_slots.sort_unstable();
    first_slots.dedup();
    assert!(first_slots.len() > 1);
}

across_topologies! {
    fn locks_under_odd_names_work_end_to_end(deployment) {
        let client = deployment.client();
        for name in ["{braced}", "a}b{c", "emoji 🔒", "nul\0byte", "%"] {
            let lock = client.lock(name).unwrap();
            let guard = lock.lock().unwrap();
            assert!(lock.is_locked().unwrap(), "{name:?}");
            let other = lock.clone();
            assert!(thread::spawn(move || other.try_lock().unwrap().is_none()).joined());
            guard.unlock().unwrap();
            assert!(!lock.is_locked().unwrap(), "{name:?}");
        }
    }
}

#[test]
fn a_thread_pays_one_incr_for_its_identity_and_none_after() {
    let deployment = Deployment::start(Topology::Single);
    let (server, client) = (deployment.server(), deployment.client());
    let lock = client.lock("identity").unwrap();
    // Load the scripts first, from a thread of its own.
    let warm = lock.clone();
    thread::spawn(move || warm.lock().unwrap().unlock().unwrap()).joined();
    let before = server.command_calls();
    for _ in 0..10 {
        lock.lock().unwrap().unlock().unwrap();
    }
    let other = lock.clone();
    thread::spawn(move || other.lock().unwrap().unlock().unwrap()).joined();
    let used = server.commands_since(&before);
    // INCR is only for identities: one per thread (the scripts set the
    // fence counter with SET).
    assert_eq!(used.get("incr"), Some(&2), "{used:?}");
    // And nothing else is sent but the scripts: 11 acquisitions, 11 releases.
    assert_eq!(used.get("evalsha"), Some(&22), "{used:?}");
}

#[test]
fn clients_and_locks_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<redbaton::Lock>();
}

across_topologies! {
    fn reentry_and_inner_release_renew_the_lease(deployment) {
        let (server, client) = (deployment.server_for(&lock_key("renew")), deployment.client());
        // A fixed lease: no watchdog renewal can hide a missing refresh.
        let lock = client
            .lock("renew")
            .unwrap()
            .with_fixed_lease(Duration::from_millis(1_000))
            .unwrap();
        let mut raw = server.connection();
        let outer = lock.lock().unwrap();
        thread::sleep(Duration::from_millis(500));
        let inner = lock.lock().unwrap();
        let after_reentry = redis::cmd("PTTL")
            .arg(lock_key("renew"))
            .query::<i64>(&mut raw)
            .unwrap();
        assert!(after_reentry > 800, "re-entry left {after_reentry} ms");
        thread::sleep(Duration::from_millis(500));
        inner.unlock().unwrap();
        let after_inner = redis::cmd("PTTL")
            .arg(lock_key("renew"))
            .query::<i64>(&mut raw)
            .unwrap();
        assert!(after_inner > 800, "inner release left {after_inner} ms");
        outer.unlock().unwrap();
    }
}

#[test]
fn an_unclaimed_baton_is_single_and_expires() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .baton_ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = client.lock("unclaimed").unwrap();
    let mut raw = server.connection();
    let batons = |raw: &mut redis::Connection| -> i64 {
        redis::cmd("LLEN")
            .arg(baton_key("unclaimed"))
            .query(raw)
            .unwrap()
    };
    // Nobody asked for the lock meanwhile: a release wakes nobody.
    lock.lock().unwrap().unlock().unwrap();
    assert_eq!(batons(&mut raw), 0, "a baton for nobody");

    // Another client asks while it is held (and would then wait), three
    // times: each release leaves a baton, and still there is one.
    let other = support::client(&server);
    for _ in 0..3 {
        let guard = lock.lock().unwrap();
        let asker = other.lock("unclaimed").unwrap();
        let refused = thread::spawn(move || asker.try_lock().unwrap().is_none()).joined();
        assert!(refused);
        guard.unlock().unwrap();
    }
    assert_eq!(batons(&mut raw), 1, "one token wakes one waiter");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(baton_key("unclaimed"))
        .query(&mut raw)
        .unwrap();
    assert!((1..=5_000).contains(&ttl), "baton PTTL {ttl}");
}

#[test]
fn a_waiter_that_gives_up_never_swallows_the_baton() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.lock("edge").unwrap();
    let mut raw = server.connection();
    for i in 0..60u32 {
        redis::cmd("DEL")
            .arg(baton_key("edge"))
            .query::<()>(&mut raw)
            .unwrap();
        let held = lock.lock().unwrap();
        let waiter = lock.clone();
        let deadline = Instant::now() + Duration::from_millis(100);
        let handle = thread::spawn(move || waiter.try_lock_until(deadline).unwrap().is_some());
        // Release from 1.5 ms before the deadline down to the deadline.
        let before = Duration::from_micros(u64::from(1_500 - 25 * i));
        thread::sleep((deadline - before).saturating_duration_since(Instant::now()));
        held.unlock().unwrap();
        let got = handle.joined();
        // A token the parked connection popped as the waiter left is given
        // back to its list (RPUSH) by the client's parking thread: it may
        // be on its way for a moment, never gone.
        let given_back = Instant::now() + Duration::from_secs(2);
        let kept = got
            || loop {
                let batons: i64 = redis::cmd("LLEN")
                    .arg(baton_key("edge"))
                    .query(&mut raw)
                    .unwrap();
                if batons == 1 || lock.is_locked().unwrap() {
                    break true;
                }
                if Instant::now() > given_back {
                    break false;
                }
                thread::sleep(Duration::from_millis(1));
            };
        assert!(kept, "round {i}: waiter gave up, lock free, baton gone");
    }
}

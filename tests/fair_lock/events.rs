//! Deployment events: a reply lost after the acquisition ran, a waiter
//! killed while queued.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::{FaultProxy, RedisServer};

use crate::support::{self, spawn_child, JoinWithin};
use crate::{
    parked_in_turn, patient, queue_key, queue_len, queued_in_turn, unlocked, AfterUnlock,
    InTurnWaiter, SCRIPTED,
};

/// Issue 21 item 8: P's acquisition of a free fair lock runs, its reply is
/// lost with the connection, and D queues before P's client sends it
/// again. The resend must find P's own first run (by its request number),
/// not be refused because D now waits ahead: otherwise the lock is held by
/// nobody's guard for a whole lease while P and D both wait.
#[test]
fn a_resent_acquisition_whose_reply_was_lost_finds_its_own_first_run() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let p = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let d = support::client(&server);
    let lock_key = "redbaton:{lost}:fair:lock";
    let exists = |key: &str| -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query(&mut server.connection())
            .unwrap()
    };
    let (armed_tx, armed_rx) = std::sync::mpsc::channel::<()>();
    let (warm_tx, warm_rx) = std::sync::mpsc::channel::<()>();
    let p_thread = {
        let lock = p.fair_lock("lost").unwrap();
        let warm = p.fair_lock("warm").unwrap();
        thread::spawn(move || {
            // This thread's identity, the pool and the script, first.
            warm.try_lock().unwrap().unwrap().unlock().unwrap();
            warm_tx.send(()).unwrap();
            armed_rx.recv().unwrap();
            let started = Instant::now();
            let guard = lock.try_lock_for(Duration::from_secs(45)).unwrap();
            let took = started.elapsed();
            let got = guard.is_some();
            if let Some(guard) = guard {
                guard.unlock().unwrap();
            }
            (got, took)
        })
    };
    // The first run's request and the resend are each held 700 ms on the
    // way: D queues in between.
    warm_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    proxy.drop_reply_to(b"EVALSHA");
    proxy.set_delay(Duration::from_millis(700));
    armed_tx.send(()).unwrap();
    support::eventually(
        Duration::from_secs(10),
        "P's first run took the lock",
        || exists(lock_key),
    );
    let d_thread = {
        let lock = d.fair_lock("lost").unwrap();
        thread::spawn(move || {
            let started = Instant::now();
            let got = lock.try_lock_for(Duration::from_secs(45)).unwrap();
            (got.is_some(), started.elapsed())
        })
    };
    support::eventually(Duration::from_secs(10), "D's place in the queue", || {
        queue_len(&server, "lost") == 1
    });
    proxy.set_delay(Duration::ZERO);
    let (p_got, p_took) = p_thread.joined();
    let (d_got, d_took) = d_thread.joined();
    println!("P acquired after {p_took:?}, D after {d_took:?}");
    assert_eq!(proxy.dropped_replies(), 1, "the first run's reply was lost");
    assert!(p_got && d_got);
    // A stranded lock would hold both for its 30 s lease.
    assert!(p_took < Duration::from_secs(10), "P waited {p_took:?}");
    assert!(d_took < Duration::from_secs(10), "D waited {d_took:?}");
    assert!(!exists(&queue_key("lost")));
}

/// Issue 21 item 10: a waiter SIGKILLed while queued, the holder unlocks,
/// the name is never used again: every key under the name's tag expires
/// (docs/how-it-works.md's promise), none is left without a TTL.
/// Issue 22: a fair release whose reply was lost runs once. P releases, the
/// release runs and its reply is lost; D takes the lock before P's client
/// sends the release again. The resend (owner- and token-checked) must
/// leave D's hold alone, and P's `unlock` reports the release.
#[test]
fn a_release_whose_reply_was_lost_leaves_the_next_holder_alone() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let p = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let d = support::client(&server);
    let lock = p.fair_lock("lost-release").unwrap();
    lock.try_lock().unwrap().expect("free").unlock().unwrap(); // scripts loaded
    let (held, wait_held) = std::sync::mpsc::channel();
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let releaser = thread::spawn(move || {
        let guard = lock.lock().unwrap();
        held.send(guard.fencing_token()).unwrap();
        wait_go.recv_timeout(Duration::from_secs(30)).unwrap();
        guard.unlock()
    });
    let first = wait_held.recv_timeout(Duration::from_secs(10)).unwrap();
    // 300 ms per request through the proxy: room for D between the first
    // run and the resend.
    proxy.set_delay(Duration::from_millis(300));
    proxy.drop_reply_to(b"EVALSHA");
    go.send(()).unwrap();
    support::eventually(Duration::from_secs(10), "the release's reply lost", || {
        proxy.dropped_replies() == 1
    });
    let d_lock = d.fair_lock("lost-release").unwrap();
    let taken = d_lock.try_lock().unwrap().expect("the first run released");
    assert!(taken.fencing_token() > first);
    releaser.joined().expect("the resend reports the release");
    proxy.set_delay(Duration::ZERO);
    let holder = d_lock.holder().unwrap().expect("D still holds it");
    assert_eq!(holder.fencing_token, taken.fencing_token(), "{holder:?}");
    taken.unlock().expect("D's hold was left alone");
    assert_eq!(d_lock.holder().unwrap(), None);
}

#[test]
fn a_killed_waiters_keys_all_expire_after_the_names_last_use() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("queue").unwrap();
    let held = lock.lock().unwrap();
    let mut doomed = spawn_child("fair_waiter", &server);
    doomed.wait_for_line("WAITING", Duration::from_secs(30));
    support::eventually(Duration::from_secs(10), "the child's place", || {
        queue_len(&server, "queue") == 1
    });
    doomed.kill();
    held.unlock().unwrap();
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redbaton:{queue}:*")
        .query(&mut con)
        .unwrap();
    assert!(
        keys.contains(&queue_key("queue")),
        "the dead waiter's place is still there: {keys:?}"
    );
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert!(ttl != -1, "{key} has no TTL (keys: {keys:?})");
    }
    let left = |con: &mut redis::Connection, pattern: &str| -> Vec<String> {
        redis::cmd("KEYS").arg(pattern).query(con).unwrap()
    };
    // The queue's keys go with the last place (1.5 park slices of the
    // child's 300 ms + 500 ms).
    support::eventually(Duration::from_secs(5), "the queue's keys expire", || {
        left(&mut con, "redbaton:{queue}:fair:lock:queue").is_empty()
            && left(&mut con, "redbaton:{queue}:fair:lock:places").is_empty()
    });
    // And the batons (the dead waiter's own list, the head's list the
    // release pushed for it) with their TTL, `baton_ttl` (5 s). (The
    // fencing counter outlives them: `fence_counter_ttl`.)
    support::eventually(Duration::from_secs(10), "the batons expire", || {
        left(&mut con, "redbaton:{queue}:fair:lock*").is_empty()
            && left(&mut con, "redbaton:{queue}:fair:wake*").is_empty()
    });
}

/// A hand-off to a parked thread of the same client (`fair/handoff.lua`)
/// whose reply was lost: the client sends it again, and the second run
/// finds the lock no longer the holder's (the first handed it over). The
/// waiter, told to look, finds the lock under its own identity and takes it
/// afresh at once, although another client's waiter is the head of the
/// queue now (the hand-off dropped the waiter's place). Were it held back
/// behind that head, it would park holding the lock, and both would wait
/// out the lease.
#[test]
fn a_hand_off_whose_reply_was_lost_leaves_the_lock_to_its_waiter_at_once() {
    const NAME: &str = "lost-handoff";
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let here = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(5))
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let there = Client::builder(server.url())
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    // The hand-off script loaded, so that the reply lost is that of a
    // hand-off that ran, not a NOSCRIPT.
    let _: String = redis::Script::new(concat!(
        include_str!("../../src/scripts/lib/next_fence.lua"),
        include_str!("../../src/scripts/lib/fair_queue.lua"),
        include_str!("../../src/scripts/fair/handoff.lua")
    ))
    .prepare_invoke()
    .load(&mut server.connection())
    .unwrap();
    let first = there.fair_lock(NAME).unwrap().lock().unwrap();
    // The holder and a waiter of `here`, then a waiter of `there`: the
    // holder's acquisition finds the waiter next.
    let waiters = [("holder", &here), ("waiter", &here), ("other", &there)];
    let (threads, order, go) = parked_in_turn(&server, NAME, &waiters, SCRIPTED);
    first.unlock().unwrap();
    let (who, holders) = order.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(who, "holder");
    proxy.drop_reply_to(b"EVALSHA");
    let released = Instant::now();
    go.send(()).unwrap();
    let rest: Vec<(&str, u64)> = (0..2)
        .map(|_| order.recv_timeout(Duration::from_secs(15)).expect("served"))
        .collect();
    let took = released.elapsed();
    for thread in threads {
        thread.joined();
    }
    assert_eq!(proxy.dropped_replies(), 1);
    assert_eq!(rest[0].0, "waiter", "{rest:?}");
    assert_eq!(rest[1].0, "other", "{rest:?}");
    assert!(rest[0].1 > holders && rest[1].1 > rest[0].1, "{rest:?}");
    assert!(took < Duration::from_secs(5), "both served after {took:?}");
    assert_eq!(queue_len(&server, NAME), 0);
    assert_eq!(there.fair_lock(NAME).unwrap().holder().unwrap(), None);
}

/// The last release of a run in memory that Redis did not answer (every
/// request through the proxy swallowed) is sent again in the background
/// once Redis answers, and drops the place of the waiter the run served:
/// another client's waiter behind that place is served at once, not when
/// the place ends (45.5 s at this `max_park`).
#[test]
fn a_runs_last_release_sent_again_in_the_background_drops_the_places_served() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let here = Client::builder(proxy.url())
        .max_park(Duration::from_secs(30))
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let times_out: AfterUnlock = |_, unlocked, _| assert!(unlocked.is_err(), "{unlocked:?}");
    let took = remote_served_after_a_run_of_two(
        &server,
        "run-later",
        &here,
        (times_out, false),
        || proxy.set_silent(true),
        |local| {
            // The local release timed out; Redis answers again.
            support::eventually(Duration::from_secs(10), "the release timed out", || {
                local.is_finished()
            });
            proxy.set_silent(false);
        },
    );
    assert!(took < Duration::from_secs(10), "served after {took:?}");
}

/// A thread holding a fair lock passed to it in memory finds it lost (the
/// lock was force-unlocked, and the watchdog's renewal found it gone): its
/// unlock sends no release, but the places its run served are dropped all
/// the same, in the background, so that another client's waiter behind
/// them is served at once, not when those places end (45.5 s here).
#[test]
fn a_run_found_lost_drops_the_places_it_served() {
    let took = served_after_a_run_found_lost("run-lost", false);
    assert!(took < Duration::from_secs(10), "served after {took:?}");
}

/// The same when the thread had re-entered and released its first level
/// before the loss: the re-entry's guard, released last, finds the lock
/// lost, and knows the places the run served, though the watchdog dropped
/// the ownership's record.
#[test]
fn a_run_found_lost_at_a_reentrys_guard_drops_the_places_it_served() {
    let took = served_after_a_run_found_lost("run-lost-reentered", true);
    assert!(took < Duration::from_secs(10), "served after {took:?}");
}

/// How long after a run's holder found fair lock `name` lost at its
/// unlock another client's waiter was served ([`remote_served_after_a_run_of_two`];
/// `reenters`: of the holder).
fn served_after_a_run_found_lost(name: &'static str, reenters: bool) -> Duration {
    let server = RedisServer::start();
    let (lost_tx, lost) = mpsc::channel();
    let lost_tx = std::sync::Mutex::new(lost_tx);
    let here = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .default_lease(Duration::from_secs(1))
        .on_event(move |event| {
            if let redbaton::Event::Lost { .. } = event {
                let _ = lost_tx.lock().unwrap().send(());
            }
        })
        .build()
        .unwrap();
    let finds_it_lost: AfterUnlock = |_, unlocked, _| {
        assert!(
            matches!(unlocked, Err(redbaton::Error::LockLost { .. })),
            "{unlocked:?}"
        );
    };
    let operator = Client::open(&server.url()).unwrap();
    remote_served_after_a_run_of_two(
        &server,
        name,
        &here,
        (finds_it_lost, reenters),
        || {
            assert!(operator.fair_lock(name).unwrap().force_unlock().unwrap());
            lost.recv_timeout(Duration::from_secs(10))
                .expect("the watchdog finds the lock gone");
        },
        |_| {},
    )
}

/// A holder and a waiter of `here` queue for the fair lock `name` behind
/// a holder of another client, then a waiter of that client: the holder
/// passes the lock to the local waiter in memory. While it holds it,
/// `meanwhile` runs; it then unlocks (`then` checks how that went; with
/// `.1`, it had re-entered, and unlocks the re-entry's guard), and
/// `after_unlock` runs with its thread. Returns how long after that the
/// other client's waiter was served; checks that the queue is left empty.
fn remote_served_after_a_run_of_two(
    server: &RedisServer,
    name: &'static str,
    here: &Client,
    (then, reenters): (AfterUnlock, bool),
    meanwhile: impl FnOnce(),
    after_unlock: impl FnOnce(&thread::JoinHandle<()>),
) -> Duration {
    let there = patient(server);
    let first = there.fair_lock(name).unwrap().lock().unwrap();
    let (holder_go, holder_may_go) = mpsc::channel::<()>();
    let (local_go, local_may_go) = mpsc::channel::<()>();
    let waiters = vec![
        InTurnWaiter {
            who: "holder",
            client: here,
            gate: Some(holder_may_go),
            then: unlocked,
            reenters: false,
        },
        InTurnWaiter {
            who: "local",
            client: here,
            gate: Some(local_may_go),
            then,
            reenters,
        },
        InTurnWaiter {
            who: "remote",
            client: &there,
            gate: None,
            then: unlocked,
            reenters: false,
        },
    ];
    let (threads, order) = queued_in_turn(server, name, waiters, None);
    first.unlock().unwrap();
    let holder = order.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(holder.0, "holder");
    holder_go.send(()).unwrap();
    let local = order.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(local, ("local", holder.1 + 1), "passed in memory");
    meanwhile();
    local_go.send(()).unwrap();
    after_unlock(&threads[1]);
    let released = Instant::now();
    let remote = order.recv_timeout(Duration::from_secs(20)).unwrap();
    let took = released.elapsed();
    assert_eq!(remote.0, "remote");
    for thread in threads {
        thread.joined();
    }
    assert_eq!(queue_len(server, name), 0);
    took
}

//! The event hook: the sequences `ClientBuilder::on_event` documents for an
//! uncontended cycle, a contended hand-off, a local hand-off and a loss,
//! and a hook that panics.

use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::Duration;

use redbaton::{Client, Event, HoldKind, LostReason};
use testkit::RedisServer;

use crate::support::{eventually, is_asleep, lock_key, parked, thread_id, JoinWithin};

/// One event as the test keeps it: its thread, a short form to compare
/// sequences, and the figures it carried.
#[derive(Debug, Clone)]
struct Seen {
    thread: ThreadId,
    what: String,
    fencing_token: Option<u64>,
    /// What an acquisition, release or loss was of.
    kind: Option<HoldKind>,
    /// `waited` of an acquisition or a wait, `held` of a release.
    took: Option<Duration>,
}

/// Everything a client's hook was told.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    pub(crate) fn hook(&self) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
        let seen = Arc::clone(&self.0);
        move |event| {
            let mut took = None;
            let mut fencing_token = None;
            let mut held_kind = None;
            let what = match *event {
                Event::Acquired {
                    name,
                    kind,
                    waited,
                    fencing_token: token,
                    how,
                    ..
                } => {
                    held_kind = Some(kind);
                    took = Some(waited);
                    fencing_token = token;
                    format!("acquired {name} {how:?}")
                }
                Event::Released {
                    name, held, kind, ..
                } => {
                    held_kind = Some(kind);
                    took = Some(held);
                    format!("released {name}")
                }
                Event::Lost {
                    name, reason, kind, ..
                } => {
                    held_kind = Some(kind);
                    format!("lost {name} {reason:?}")
                }
                Event::Parked { name, .. } => format!("parked {name}"),
                Event::Woken { name, waited, .. } => {
                    took = Some(waited);
                    format!("woken {name}")
                }
                Event::ReleaseFailed {
                    name, held, kind, ..
                } => {
                    held_kind = Some(kind);
                    took = Some(held);
                    format!("release failed {name}")
                }
                Event::RenewalFailed { name, .. } => format!("renewal failed {name}"),
                Event::ReleaseRetried { name, .. } => format!("release retried {name}"),
                ref other => format!("{other:?}"),
            };
            seen.lock().unwrap().push(Seen {
                thread: thread::current().id(),
                what,
                fencing_token,
                kind: held_kind,
                took,
            });
        }
    }

    fn events(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    /// The short forms, in order.
    pub(crate) fn whats(&self) -> Vec<String> {
        self.events().into_iter().map(|s| s.what).collect()
    }

    /// The short forms of `thread`'s events, in order.
    fn of(&self, thread: ThreadId) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|s| s.thread == thread)
            .map(|s| s.what)
            .collect()
    }
}

fn observed(server: &RedisServer, recorder: &Recorder) -> Client {
    Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .on_event(recorder.hook())
        .build()
        .unwrap()
}

#[test]
fn an_uncontended_cycle_is_acquired_then_released() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let guard = client.lock("plain").unwrap().lock().unwrap();
    let token = guard.fencing_token();
    guard.unlock().unwrap();
    assert_eq!(
        recorder.whats(),
        ["acquired plain FirstAttempt", "released plain"]
    );
    let events = recorder.events();
    assert_eq!(events[0].fencing_token, Some(token));
    assert!(events[0].took.unwrap() < Duration::from_secs(2));
    assert!(events.iter().all(|s| s.kind == Some(HoldKind::Lock)));
    assert!(events.iter().all(|s| s.thread == thread::current().id()));
}

#[test]
fn a_multi_lock_announces_each_name_acquired_then_released() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let both = client.multi_lock(["pears", "apples"]).unwrap();
    let guard = both.lock().unwrap();
    let mut tokens: Vec<u64> = guard.fencing_tokens().map(|(_, token)| token).collect();
    guard.unlock().unwrap();
    // try_lock tells the same.
    let tried = both.try_lock().unwrap().expect("free");
    tokens.extend(tried.fencing_tokens().map(|(_, token)| token));
    drop(tried);
    let cycle = [
        "acquired apples FirstAttempt",
        "acquired pears FirstAttempt",
        "released pears",
        "released apples",
    ];
    assert_eq!(recorder.whats(), [cycle, cycle].concat());
    let announced: Vec<u64> = recorder
        .events()
        .iter()
        .filter_map(|seen| seen.fencing_token)
        .collect();
    assert_eq!(announced, tokens);
}

/// A set that waits past `hold_back_after` (then takes its names one at a
/// time) and gets both is told acquired, per name, and never timed out:
/// the end of its first stretch of waiting is no time out.
#[test]
fn a_multi_lock_that_waits_long_is_told_acquired_not_timed_out() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.lock("plums").unwrap().lock().unwrap();
    let both = client
        .multi_lock(["plums", "figs"])
        .unwrap()
        .hold_back_after(Duration::from_millis(50));
    let waiting = thread::spawn(move || {
        both.try_lock_for(Duration::from_secs(10))
            .unwrap()
            .is_some()
    });
    // Past its first stretch: it holds figs, the first name in its order.
    eventually(Duration::from_secs(5), "the set holds figs", || {
        let exists: bool = redis::cmd("EXISTS")
            .arg(lock_key("figs"))
            .query(&mut server.connection())
            .unwrap();
        exists
    });
    held.unlock().unwrap();
    assert!(waiting.joined());
    let whats = recorder.whats();
    assert!(
        !whats.iter().any(|what| what.contains("TimedOut")),
        "{whats:?}"
    );
    let acquired: Vec<&String> = whats
        .iter()
        .filter(|what| what.starts_with("acquired"))
        .collect();
    assert_eq!(
        acquired,
        ["acquired figs AfterWaiting", "acquired plums AfterWaiting"],
        "{whats:?}"
    );
}

/// A fixed lease told lost at its end (by the client's clock) whose release
/// still finds the key in Redis: the hold ended with `Lost`, so the release
/// tells nothing more (a `Released` too would count the hold out twice).
#[test]
fn a_hold_told_lost_ends_with_lost_alone_even_if_its_release_finds_the_key() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let lock = client
        .lock("told")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(200))
        .unwrap();
    let guard = lock.lock().unwrap();
    // The key outlives the client's view of the lease: the release below
    // finds it and frees it.
    let _: () = redis::cmd("PEXPIRE")
        .arg(lock_key("told"))
        .arg(10_000)
        .query(&mut server.connection())
        .unwrap();
    let lost = guard.lost();
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(5)),
        Ok(LostReason::LeaseEnded)
    );
    guard.unlock().expect("the key was still there");
    assert_eq!(
        recorder.whats(),
        ["acquired told FirstAttempt", "lost told LeaseEnded"]
    );
}

/// The same hold whose release finds the key gone: still `Lost` alone, not
/// a second `Lost` from the release.
#[test]
fn a_hold_told_lost_ends_with_one_lost_when_its_release_finds_the_key_gone() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let lock = client
        .lock("gone")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(200))
        .unwrap();
    let guard = lock.lock().unwrap();
    let lost = guard.lost();
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(5)),
        Ok(LostReason::LeaseEnded)
    );
    let _: () = redis::cmd("DEL")
        .arg(lock_key("gone"))
        .query(&mut server.connection())
        .unwrap();
    let err = guard.unlock().expect_err("the key is gone");
    assert!(err.is_lost(), "{err}");
    assert_eq!(
        recorder.whats(),
        ["acquired gone FirstAttempt", "lost gone LeaseEnded"]
    );
}

#[test]
fn a_contended_hand_off_parks_wakes_and_acquires_after_waiting() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.lock("contended").unwrap().lock().unwrap();
    let lock = client.lock("contended").unwrap();
    let waiter = thread::spawn(move || {
        let guard = lock.lock().unwrap();
        let token = guard.fencing_token();
        guard.unlock().unwrap();
        (thread::current().id(), token)
    });
    eventually(Duration::from_secs(10), "the waiter parked", || {
        parked(&server) == 1
    });
    assert_eq!(recorder.whats(), ["parked contended"]);
    held.unlock().unwrap();
    let (waiter_thread, token) = waiter.joined();
    assert_eq!(
        recorder.of(waiter_thread),
        [
            "parked contended",
            "woken contended",
            "acquired contended AfterWaiting",
            "released contended"
        ]
    );
    assert_eq!(
        recorder.whats().len(),
        4,
        "nothing else: {:?}",
        recorder.whats()
    );
    let events = recorder.events();
    assert_eq!(events[2].fencing_token, Some(token));
    // The wait, as the wake-up and the acquisition measured it.
    assert!(events[1].took.unwrap() > Duration::ZERO);
    assert!(events[2].took.unwrap() >= events[1].took.unwrap());
}

#[test]
fn a_local_hand_off_is_acquired_by_hand_off() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let lock = client.lock("local").unwrap();
    let held = lock.lock().unwrap();
    // The first waiter parks in Redis; the second waits in the process's
    // queue, and is the one a local release hands the lock to.
    let (ready, queued) = mpsc::channel();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let (lock, ready) = (lock.clone(), ready.clone());
        waiters.push(thread::spawn(move || {
            // The thread's identity, before it queues.
            assert!(lock.try_lock().unwrap().is_none());
            ready.send(thread_id()).unwrap();
            let guard = lock.lock().unwrap();
            guard.unlock().unwrap();
            thread::current().id()
        }));
        let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
        eventually(Duration::from_secs(10), "the waiter waits", || {
            is_asleep(tid) && parked(&server) == 1
        });
    }
    held.unlock().unwrap();
    let parker = waiters.remove(0).joined();
    let handed = waiters.remove(0).joined();
    assert_eq!(
        recorder.of(thread::current().id()),
        ["acquired local FirstAttempt", "released local"]
    );
    assert_eq!(
        recorder.of(handed),
        [
            "parked local",
            "woken local",
            "acquired local LocalHandoff",
            "released local"
        ]
    );
    assert_eq!(
        recorder.of(parker),
        [
            "parked local",
            "woken local",
            "acquired local AfterWaiting",
            "released local"
        ]
    );
}

#[test]
fn a_loss_is_told_once_with_its_reason_and_the_release_is_not() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = Client::builder(server.url())
        .default_lease(Duration::from_millis(600))
        .on_event(recorder.hook())
        .build()
        .unwrap();
    let guard = client.lock("lost").unwrap().lock().unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(lock_key("lost"))
        .query(&mut server.connection())
        .unwrap();
    eventually(Duration::from_secs(5), "the loss is told", || {
        recorder.whats().len() == 2
    });
    assert!(guard.unlock().is_err());
    assert_eq!(
        recorder.whats(),
        [
            "acquired lost FirstAttempt",
            format!("lost lost {:?}", LostReason::Gone).as_str()
        ]
    );
    let lost = &recorder.events()[1];
    assert_ne!(lost.thread, thread::current().id(), "told by the watchdog");
}

#[test]
fn every_hook_set_is_told_in_the_order_set() {
    let server = RedisServer::start();
    let (first, second) = (Recorder::default(), Recorder::default());
    let order = Arc::new(Mutex::new(Vec::new()));
    let (one, two) = (Arc::clone(&order), Arc::clone(&order));
    let client = Client::builder(server.url())
        .on_event(first.hook())
        .on_event(move |_| one.lock().unwrap().push(1))
        .on_event(second.hook())
        .on_event(move |_| two.lock().unwrap().push(2))
        .build()
        .unwrap();
    client
        .lock("both")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    let cycle = ["acquired both FirstAttempt", "released both"];
    assert_eq!(first.whats(), cycle);
    assert_eq!(second.whats(), cycle);
    assert_eq!(*order.lock().unwrap(), [1, 2, 1, 2]);
}

#[test]
fn a_panicking_hook_does_not_break_the_client_and_is_logged_once() {
    let server = RedisServer::start();
    let before = crate::logged("event hook panicked");
    let calls = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&calls);
    let client = Client::builder(server.url())
        .on_event(move |_| {
            *counted.lock().unwrap() += 1;
            panic!("a broken hook");
        })
        .build()
        .unwrap();
    let lock = client.lock("panicky").unwrap();
    for _ in 0..3 {
        let guard = lock.lock().unwrap();
        assert!(!guard.is_lost());
        guard.unlock().unwrap();
    }
    assert!(!lock.is_locked().unwrap());
    assert_eq!(*calls.lock().unwrap(), 6, "called for every event");
    assert_eq!(crate::logged("event hook panicked") - before, 1);
}

#[test]
fn read_write_and_permit_cycles_say_what_they_hold() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = observed(&server, &recorder);
    let rw = client.rw_lock("rw").unwrap();
    rw.read().unwrap().unlock().unwrap();
    let write = rw.try_write().unwrap().expect("free");
    let token = write.fencing_token();
    write.unlock().unwrap();
    let fair = client.fair_lock("fair").unwrap();
    fair.lock().unwrap().unlock().unwrap();
    let semaphore = client.semaphore("pool").unwrap();
    semaphore.try_set_permits(2).unwrap();
    semaphore.acquire_many(2).unwrap().release().unwrap();
    let events = recorder.events();
    let seen: Vec<(String, Option<HoldKind>, Option<u64>)> = events
        .into_iter()
        .map(|s| (s.what, s.kind, s.fencing_token))
        .collect();
    let acquired = |name: &str| format!("acquired {name} FirstAttempt");
    let released = |name: &str| format!("released {name}");
    assert_eq!(
        seen,
        [
            (acquired("rw"), Some(HoldKind::Read), None),
            (released("rw"), Some(HoldKind::Read), None),
            (acquired("rw"), Some(HoldKind::Write), Some(token)),
            (released("rw"), Some(HoldKind::Write), None),
            (acquired("fair"), Some(HoldKind::FairLock), seen[4].2),
            (released("fair"), Some(HoldKind::FairLock), None),
            (acquired("pool"), Some(HoldKind::Permits), None),
            (released("pool"), Some(HoldKind::Permits), None),
        ]
    );
    assert!(seen[4].2.is_some(), "a fair lock has a fencing token");
}

#[test]
fn redis_going_away_is_told_as_failed_renewals_a_loss_and_a_background_release() {
    let server = RedisServer::start();
    let recorder = Recorder::default();
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(300))
        .on_event(recorder.hook())
        .build()
        .unwrap();
    let renewed = client
        .lock("renewed")
        .unwrap()
        .with_lease(Duration::from_millis(600))
        .unwrap()
        .lock()
        .unwrap();
    let released = client.lock("released").unwrap().lock().unwrap();
    server.kill();
    assert!(released.unlock().is_err(), "Redis is gone");
    eventually(Duration::from_secs(5), "the loss is told", || {
        recorder
            .whats()
            .iter()
            .any(|w| w.starts_with("lost renewed"))
    });
    let whats = recorder.whats();
    let at = |what: &str| whats.iter().position(|w| w == what);
    let failed = at("renewal failed renewed").expect("a failed renewal is told");
    let lost = at(&format!("lost renewed {:?}", LostReason::Unreachable)).expect("lost");
    assert!(failed < lost, "{whats:?}");
    // The release goes on in the background, then the caller's release is
    // told failed.
    let retried = at("release retried released").expect("a background release");
    assert_eq!(
        at("release failed released"),
        Some(retried + 1),
        "{whats:?}"
    );
    assert!(
        !whats.iter().any(|w| w.starts_with("released")),
        "nothing was released: {whats:?}"
    );
    drop(renewed);
}

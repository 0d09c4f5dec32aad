//! Barging across clients: a thread that releases and takes the lock again
//! at once must not starve the waiters of another client (another
//! process, as far as Redis can tell). Its release wakes one of them, whose
//! wake-up takes a few round trips; meanwhile the lock waits for a waiter
//! (a short hand-over window), so the thread that just released it queues
//! like anyone else.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, JoinWithin};
use redbaton::Client;
use testkit::RedisServer;

/// How long each holder keeps the lock.
const HOLD: Duration = Duration::from_millis(2);

/// Entries the waiting client makes.
const ENTRIES: usize = 10;

/// The longest any of them may wait: a few hundred of the hog's cycles
/// (a starved waiter waits out its whole `try_lock_for`).
const BOUND: Duration = Duration::from_secs(2);

#[test]
fn a_thread_that_takes_the_lock_again_at_once_does_not_starve_another_clients_waiter() {
    let server = RedisServer::start();
    let hog_client = Client::open(&server.url()).unwrap();
    let waiting_client = Client::open(&server.url()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let hog = {
        let lock = hog_client.lock("barged").unwrap();
        let (stop, cycles) = (Arc::clone(&stop), Arc::clone(&cycles));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.lock().unwrap();
                thread::sleep(HOLD);
                guard.unlock().unwrap();
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    eventually(Duration::from_secs(10), "the hog cycles", || {
        cycles.load(Ordering::Relaxed) >= 20
    });

    let lock = waiting_client.lock("barged").unwrap();
    let (mut got, mut longest) = (0, Duration::ZERO);
    for _ in 0..ENTRIES {
        let asked = Instant::now();
        let guard = lock.try_lock_for(Duration::from_secs(10)).unwrap();
        longest = longest.max(asked.elapsed());
        let Some(guard) = guard else { break };
        got += 1;
        thread::sleep(HOLD);
        guard.unlock().unwrap();
        // Back as a newcomer, behind the hog's waiting thread.
        thread::sleep(HOLD);
    }
    stop.store(true, Ordering::Relaxed);
    hog.joined();
    assert!(
        got == ENTRIES && longest <= BOUND,
        "the waiting client got {} of {ENTRIES} entries, longest wait {longest:?} (bound \
         {BOUND:?}), while the hog cycled {} times",
        got,
        cycles.load(Ordering::Relaxed)
    );
}

#[test]
fn a_window_its_waiter_left_costs_a_newcomer_little_and_a_try_lock_nothing() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lock = client.lock("left").unwrap();
    let held = lock.lock().unwrap();
    // A waiter of another thread looks, parks, and gives up: the release
    // opens a window for it (its attempts marked the ownership), which
    // nobody comes to take.
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            lock.try_lock_for(Duration::from_millis(300))
                .unwrap()
                .is_some()
        })
    };
    assert!(!waiter.joined(), "held throughout");
    held.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "a window is nobody's hold");
    assert!(
        lock.holder().unwrap().is_none(),
        "a window is nobody's hold"
    );
    // A newcomer waits out the window (its attempt is told the window's
    // time left, and it parks that long); a try_lock takes it.
    let asked = Instant::now();
    let guard = lock.lock().unwrap();
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "the newcomer waited {waited:?}"
    );
    guard.unlock().unwrap();
    let second = lock.clone();
    let held = lock.lock().unwrap();
    let waiter = thread::spawn(move || {
        second
            .try_lock_for(Duration::from_millis(300))
            .unwrap()
            .is_some()
    });
    assert!(!waiter.joined(), "held throughout");
    held.unlock().unwrap();
    assert!(
        lock.try_lock().unwrap().is_some(),
        "a try_lock takes a window"
    );
}

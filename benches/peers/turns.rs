//! The floors of a lock's hand-offs inside one process, for the lock
//! bench's one-process run to measure redbaton against: a first-come,
//! first-served lock in memory (`std::sync::Mutex` over a queue, each
//! waiter woken by `unpark` when the lock is handed to it), taken in
//! strict turns as redbaton's are (no thread twice in a row while others
//! wait). Two ways:
//!
//! - `memory`: nothing but the hand-off, one thread wake each: the floor
//!   of the plain lock's in-process hand-off;
//! - `arrival through Redis`: each thread sends one `PING` on its own
//!   connection before it queues, as the fair lock's threads each take a
//!   place in the queue in Redis before they are served in memory (their
//!   arrival order must hold against other processes): the floor of the
//!   fair lock's in-process hand-off.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// A first-come, first-served lock in memory that hands itself to the
/// waiter at the head of its queue.
#[derive(Default)]
struct Turns {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: bool,
    /// The waiters in arrival order: the thread to wake, and the flag the
    /// release sets when it hands the lock to it.
    queue: VecDeque<(Thread, Arc<AtomicBool>)>,
}

impl Turns {
    fn lock(&self) {
        let handed = {
            let mut state = self.state.lock().expect("turns");
            if !state.held {
                state.held = true;
                return;
            }
            let handed = Arc::new(AtomicBool::new(false));
            state
                .queue
                .push_back((thread::current(), Arc::clone(&handed)));
            handed
        };
        while !handed.load(Ordering::Acquire) {
            thread::park();
        }
    }

    fn unlock(&self) {
        let mut state = self.state.lock().expect("turns");
        match state.queue.pop_front() {
            Some((thread, handed)) => {
                drop(state);
                handed.store(true, Ordering::Release);
                thread.unpark();
            }
            None => state.held = false,
        }
    }
}

/// `threads` threads taking the in-memory lock in turn for `run`, each
/// sending a `PING` to `url` before it asks where `arrival_through_redis`;
/// the holds as `(thread, asked, got, released)`, wall-clock nanoseconds.
pub fn contend(
    url: &str,
    threads: usize,
    run: Duration,
    arrival_through_redis: bool,
    now_ns: fn() -> u64,
) -> Vec<(u64, u64, u64, u64)> {
    let turns = Arc::new(Turns::default());
    let start = Arc::new(Barrier::new(threads));
    let end = Instant::now() + run;
    let handles: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (turns, start) = (Arc::clone(&turns), Arc::clone(&start));
            let mut conn = arrival_through_redis.then(|| {
                redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .expect("connect")
            });
            thread::spawn(move || {
                let mut holds = Vec::new();
                start.wait();
                while Instant::now() < end {
                    let asked = now_ns();
                    if let Some(conn) = conn.as_mut() {
                        let _: String = redis::cmd("PING").query(conn).expect("PING");
                    }
                    turns.lock();
                    let got = now_ns();
                    let released = now_ns();
                    turns.unlock();
                    holds.push((t, asked, got, released));
                }
                holds
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect()
}

//! Redlock figures: redbaton's quorum lock (`Topology::masters`, feature
//! `redlock`) against the `redlock` crate (a widely used sync Rust Redlock),
//! on the same throwaway independent masters in the same run, once with 3
//! masters and once with 5.
//!
//! For each master count N it prints:
//!
//! 1. the median `PING` on a raw connection to one master: the reference;
//! 2. the median uncontended cycle (lock, then unlock) of each peer, as a
//!    multiple of that `PING` (the goal for redbaton: ≤ 2.5 × with 5
//!    masters);
//! 3. contended throughput: 8 threads of one process on one lock for 2 s,
//!    per peer: acquisitions per second and the longest wait of any
//!    acquisition (mutual exclusion is checked too: no two holders'
//!    intervals may overlap);
//! 4. crash recovery: a holder takes the lock with a 1 s lease and never
//!    releases it (redbaton: a fixed lease and a forgotten guard; the crate:
//!    a 1000 ms TTL never unlocked), a waiter on another client starts right
//!    away; the time from the end of the lease (the holder's acquisition
//!    plus 1 s) to the waiter's acquisition, median of 3 runs.
//!
//! ```text
//! cargo bench --bench redlock --features redlock
//! ```
//!
//! Needs `redis-server` on PATH; starts its own masters on free loopback
//! ports (`testkit::RedisServer`) and takes about half a minute. Absolute
//! times are noisy on a shared machine (and every master runs on it); the
//! ratios to `PING` are what to compare.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Topology};
use testkit::RedisServer;

/// The master counts measured, in this order.
const MASTER_COUNTS: [usize; 2] = [3, 5];
/// Timed rounds per median (`PING`, redbaton's cycle); a tenth more run
/// untimed first.
const ROUNDS: usize = 2_000;
/// Timed rounds of the `redlock` crate's cycle, which opens a connection per
/// master per command and so is far slower.
const PEER_ROUNDS: usize = 300;
/// redbaton's goal for the uncontended cycle with 5 masters, × `PING`.
const GOAL: f64 = 2.5;
/// The master count the goal is set for.
const GOAL_MASTERS: usize = 5;
/// Threads on the one lock in the contended run.
const CONTENDERS: usize = 8;
/// How long each peer's contended run asks for the lock.
const CONTENDED_RUN: Duration = Duration::from_secs(2);
/// The lease of the holder that never releases.
const CRASH_LEASE: Duration = Duration::from_secs(1);
/// Crash-recovery runs per peer (the median is printed).
const CRASH_RUNS: usize = 3;
/// The `redlock` crate's TTL where the lock is released normally.
const PEER_TTL_MS: usize = 10_000;

/// The two locks under test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Redbaton,
    RedlockCrate,
}

impl Peer {
    const BOTH: [Peer; 2] = [Peer::Redbaton, Peer::RedlockCrate];

    fn name(self) -> &'static str {
        match self {
            Peer::Redbaton => "redbaton",
            Peer::RedlockCrate => "redlock crate",
        }
    }
}

/// A redbaton client on all of `urls` as independent masters.
fn quorum_client(urls: &[String]) -> Client {
    Client::builder(Topology::masters(urls))
        .build()
        .expect("quorum client")
}

/// The `redlock` crate's lock manager on all of `urls`.
fn peer_manager(urls: &[String]) -> redlock::RedLock {
    redlock::RedLock::new(urls.to_vec())
}

/// The median time of one call of `f` over `rounds` calls, after
/// `rounds / 10` untimed ones.
fn median(rounds: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..rounds / 10 {
        f();
    }
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[rounds / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(d: Duration, ping: Duration) -> f64 {
    d.as_secs_f64() / ping.as_secs_f64()
}

fn verdict(ratio: f64, goal: f64) -> &'static str {
    if ratio <= goal {
        "met"
    } else {
        "not met"
    }
}

fn ping_median(conn: &mut redis::Connection) -> Duration {
    median(ROUNDS, || {
        redis::cmd("PING")
            .query::<String>(conn)
            .map(drop)
            .expect("PING")
    })
}

/// The median uncontended lock + unlock of `peer` on `urls`.
fn uncontended_cycle(peer: Peer, urls: &[String]) -> Duration {
    match peer {
        Peer::Redbaton => {
            let client = quorum_client(urls);
            let lock = client.lock("bench:redlock:uncontended").expect("name");
            median(ROUNDS, || {
                lock.lock().expect("lock").unlock().expect("unlock")
            })
        }
        Peer::RedlockCrate => {
            let manager = peer_manager(urls);
            median(PEER_ROUNDS, || {
                let held = manager
                    .lock(b"bench:redlock:uncontended:crate", PEER_TTL_MS)
                    .expect("redlock crate")
                    .expect("uncontended: free");
                manager.unlock(&held);
            })
        }
    }
}

/// One acquisition in a contended run: when the thread asked, got the lock
/// and let it go.
#[derive(Clone, Copy, Debug)]
struct Event {
    asked: Instant,
    got: Instant,
    released: Instant,
}

/// What a contended run showed.
struct Contended {
    acquisitions: usize,
    per_second: f64,
    longest_wait: Duration,
    /// Acquisitions that began before the previous holder let go.
    overlaps: usize,
    /// Failed `lock()` calls (the thread asks again), and the first error.
    errors: usize,
    first_error: Option<String>,
}

/// `CONTENDERS` threads of one process take turns on one lock until
/// `CONTENDED_RUN` has passed; empty critical section.
fn contend(peer: Peer, urls: &[String]) -> Contended {
    let client = quorum_client(urls);
    let manager = Arc::new(peer_manager(urls));
    let start = Arc::new(Barrier::new(CONTENDERS + 1));
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let (client, manager, start) =
                (client.clone(), Arc::clone(&manager), Arc::clone(&start));
            thread::spawn(move || {
                let lock = client.lock("bench:redlock:contended").expect("name");
                let mut events = Vec::new();
                let mut errors = Vec::new();
                start.wait();
                let end = Instant::now() + CONTENDED_RUN;
                while Instant::now() < end {
                    let asked = Instant::now();
                    match peer {
                        Peer::Redbaton => match lock.lock() {
                            Ok(guard) => {
                                let got = Instant::now();
                                let released = Instant::now();
                                if let Err(err) = guard.unlock() {
                                    errors.push(format!("unlock: {err}"));
                                }
                                events.push(Event {
                                    asked,
                                    got,
                                    released,
                                });
                            }
                            Err(err) => errors.push(format!("lock: {err}")),
                        },
                        Peer::RedlockCrate => {
                            match manager.acquire(b"bench:redlock:contended:crate", PEER_TTL_MS) {
                                Ok(held) => {
                                    let got = Instant::now();
                                    let released = Instant::now();
                                    drop(held);
                                    events.push(Event {
                                        asked,
                                        got,
                                        released,
                                    });
                                }
                                Err(err) => errors.push(format!("acquire: {err}")),
                            }
                        }
                    }
                }
                (events, errors)
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    let mut events = Vec::new();
    let mut errors = Vec::new();
    for handle in handles {
        let (e, r) = handle.join().expect("contender");
        events.extend(e);
        errors.extend(r);
    }
    events.sort_by_key(|e| e.got);
    let overlaps = events
        .windows(2)
        .filter(|pair| pair[1].got < pair[0].released)
        .count();
    let last = events.iter().map(|e| e.released).max().unwrap_or(started);
    Contended {
        acquisitions: events.len(),
        per_second: events.len() as f64 / last.duration_since(started).as_secs_f64().max(1e-9),
        longest_wait: events
            .iter()
            .map(|e| e.got.duration_since(e.asked))
            .max()
            .unwrap_or_default(),
        overlaps,
        errors: errors.len(),
        first_error: errors.into_iter().next(),
    }
}

/// One crash-recovery run: a holder that takes the lock with a
/// `CRASH_LEASE` lease and never releases it, then a waiter on another
/// client. Milliseconds from the end of the lease (the holder's acquisition
/// plus `CRASH_LEASE`) to the waiter's acquisition; negative if the waiter
/// got in before.
fn crash_recovery(peer: Peer, urls: &[String], round: usize) -> f64 {
    let name = format!("bench:redlock:crash:{round}");
    let (lease_end, got) = match peer {
        Peer::Redbaton => {
            let holder = quorum_client(urls);
            let waiter = quorum_client(urls);
            let guard = holder
                .lock(&name)
                .expect("name")
                .with_fixed_lease(CRASH_LEASE)
                .expect("lease")
                .lock()
                .expect("holder");
            let lease_end = Instant::now() + CRASH_LEASE;
            // The holder "crashes": its lock is never released.
            std::mem::forget(guard);
            let lock = waiter.lock(&name).expect("name");
            lock.lock().expect("waiter").unlock().expect("unlock");
            (lease_end, Instant::now())
        }
        Peer::RedlockCrate => {
            let holder = peer_manager(urls);
            let waiter = peer_manager(urls);
            let lease_ms = CRASH_LEASE.as_millis() as usize;
            // Never unlocked: `Lock` releases nothing when dropped.
            let _held = holder
                .lock(name.as_bytes(), lease_ms)
                .expect("redlock crate")
                .expect("holder: free");
            let lease_end = Instant::now() + CRASH_LEASE;
            drop(
                waiter
                    .acquire(name.as_bytes(), PEER_TTL_MS)
                    .expect("waiter"),
            );
            (lease_end, Instant::now())
        }
    };
    match got.checked_duration_since(lease_end) {
        Some(late) => ms(late),
        None => -ms(lease_end.duration_since(got)),
    }
}

fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn figures(masters: usize) {
    let servers: Vec<RedisServer> = (0..masters).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let n = format!("N={masters}");

    let ping = ping_median(&mut servers[0].connection());
    println!(
        "{n} PING (one master, raw connection, median of {ROUNDS}): {:.1} µs",
        us(ping)
    );

    let cycles: Vec<Duration> = Peer::BOTH
        .iter()
        .map(|&peer| uncontended_cycle(peer, &urls))
        .collect();
    let goal = if masters == GOAL_MASTERS {
        format!("goal ≤ {GOAL} ×: {}", verdict(ratio(cycles[0], ping), GOAL))
    } else {
        format!("(goal ≤ {GOAL} × is for {GOAL_MASTERS} masters)")
    };
    println!(
        "{n} uncontended cycle (median; redbaton of {ROUNDS}, crate of {PEER_ROUNDS}): redbaton {:.1} µs = {:.2} × PING, redlock crate {:.1} µs = {:.2} × PING — {goal}",
        us(cycles[0]),
        ratio(cycles[0], ping),
        us(cycles[1]),
        ratio(cycles[1], ping)
    );

    let runs: Vec<Contended> = Peer::BOTH
        .iter()
        .map(|&peer| contend(peer, &urls))
        .collect();
    println!(
        "{n} contended ({CONTENDERS} threads, one lock, {CONTENDED_RUN:?} each): redbaton {:.0} acq/s, longest wait {:.1} ms; redlock crate {:.0} acq/s, longest wait {:.1} ms  [acquisitions {} / {}, overlaps {} / {}, errors {} / {}]",
        runs[0].per_second,
        ms(runs[0].longest_wait),
        runs[1].per_second,
        ms(runs[1].longest_wait),
        runs[0].acquisitions,
        runs[1].acquisitions,
        runs[0].overlaps,
        runs[1].overlaps,
        runs[0].errors,
        runs[1].errors
    );
    for (peer, run) in Peer::BOTH.iter().zip(&runs) {
        if let Some(err) = &run.first_error {
            println!("{n}   {} first error: {err}", peer.name());
        }
    }

    let mut round = 0;
    let recoveries: Vec<(f64, Vec<f64>)> = Peer::BOTH
        .iter()
        .map(|&peer| {
            let runs: Vec<f64> = (0..CRASH_RUNS)
                .map(|_| {
                    round += 1;
                    crash_recovery(peer, &urls, round)
                })
                .collect();
            (median_f64(runs.clone()), runs)
        })
        .collect();
    let list = |runs: &[f64]| {
        runs.iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "{n} crash recovery ({CRASH_LEASE:?} lease never released; lease end → waiter's acquisition, median of {CRASH_RUNS}): redbaton {:.1} ms, redlock crate {:.1} ms  [runs: {} ms; {} ms]",
        recoveries[0].0,
        recoveries[1].0,
        list(&recoveries[0].1),
        list(&recoveries[1].1)
    );
}

fn main() {
    let started = Instant::now();
    println!("redbaton Redlock benchmarks: redbaton (Topology::masters) vs the redlock crate 2, on local independent masters\n");
    for (i, masters) in MASTER_COUNTS.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        figures(masters);
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
}

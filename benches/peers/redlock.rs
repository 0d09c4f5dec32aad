//! Redlock figures: redbaton's quorum lock (`Topology::masters`, feature
//! `redlock`) against two Rust Redlock crates, on the same throwaway
//! independent masters in the same run, once with 3 masters and once with
//! 5:
//!
//! - the `redlock` crate 2 (sync; opens a connection per master per
//!   command, sleep-retries);
//! - `rslock` 0.10 (async, on tokio: one multiplexed connection per
//!   master, sleep-retries). It is driven from the same std threads as the
//!   others, each thread with its own current-thread tokio runtime
//!   (`block_on`) and its own `LockManager`: a manager's connections are
//!   driven by the runtime that opened them, so one shared between
//!   current-thread runtimes would stall.
//!
//! The sleep-retry crates are used as their docs say: ask again until
//! acquired (`acquire`, or `lock` in a loop), with their default retries
//! (3 attempts with a random sleep of up to 200 ms between them, per call).
//!
//! For each master count N it prints one table, every figure also as a
//! multiple of the median `PING` on a raw connection to one master measured
//! in the same run, and the best peer per column:
//!
//! 1. uncontended cycle: the median lock, then unlock (the goal for
//!    redbaton: ≤ 2.5 × `PING` with 5 masters);
//! 2. contended throughput: 8 threads of one process on one lock for 2 s,
//!    empty critical section: acquisitions per second, and as × `PING` the
//!    mean time per acquisition (mutual exclusion is checked too: no two
//!    holders' intervals may overlap; a peer with overlaps is not ranked);
//! 3. longest wait: of any acquisition in that run, from asking to holding
//!    (through every retry);
//! 4. hand-off to another worker: the parent holds the lock, a child
//!    process (this bench again, `--child handoff ...`, its own client) is
//!    told to ask for it, and `HANDOFF_HOLD` later the parent lets go; the
//!    time from just before the parent's unlock to just after the child's
//!    acquisition (wall clock, comparable between processes), median of
//!    `HANDOFFS` (after `HANDOFF_WARM_UP` untimed rounds); rounds where the
//!    child had not yet asked when the lock was let go are not hand-offs
//!    and are counted apart. redbaton's waiter is parked in `lock()`; the
//!    crates' is in their retry loop;
//! 5. crash recovery: a holder takes the lock with a 1 s lease and never
//!    releases it (redbaton: a fixed lease and a forgotten guard; the
//!    crates: a 1000 ms TTL never unlocked), a waiter on another client
//!    starts right away; the time from the end of the lease (the holder's
//!    acquisition plus 1 s) to the waiter's acquisition, median of 3 runs (a
//!    negative figure is a waiter in before the end of the lease, not
//!    ranked);
//! 6. the masters' CPU time per uncontended cycle (their main threads,
//!    all masters together, from `INFO cpu`): on a machine whose cores the
//!    masters share, what a cycle costs the servers shows in its wall time;
//! 7. redbaton only: the uncontended cycle with as many masters stopped
//!    (SIGSTOP) as a majority can do without, against its healthy cycle
//!    of the same run (the peers are not run with stopped masters).
//!
//! ```text
//! cargo bench --manifest-path benches/peers/Cargo.toml --bench redlock
//! ```
//!
//! Needs `redis-server` on PATH; starts its own masters on free loopback
//! ports (`testkit::RedisServer`) and takes about a minute.
//! Absolute times are noisy on a shared machine (and every master runs on
//! it); the ratios to `PING` are what to compare.

use std::env;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redbaton::{Client, Topology};
use testkit::RedisServer;
use tokio::runtime::Runtime;

/// The master counts measured, in this order.
const MASTER_COUNTS: [usize; 2] = [3, 5];
/// Timed rounds per median (`PING`, redbaton's and rslock's cycle); a tenth
/// more run untimed first.
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
/// Timed hand-offs per peer (the median is printed).
const HANDOFFS: usize = 50;
/// Untimed hand-off rounds first, and lock cycles each side runs before
/// them (connections, scripts).
const HANDOFF_WARM_UP: usize = 5;
/// How long the parent keeps the lock after telling the child to ask: long
/// enough that the child is surely waiting (parked, or in its retry loop).
const HANDOFF_HOLD: Duration = Duration::from_millis(10);
/// Errors one hand-off child tolerates in one wait before it gives up.
const HANDOFF_MAX_ERRORS: usize = 100;
/// The lease of the holder that never releases.
const CRASH_LEASE: Duration = Duration::from_secs(1);
/// Crash-recovery runs per peer (the median is printed).
const CRASH_RUNS: usize = 3;
/// The crates' TTL where the lock is released normally.
const PEER_TTL: Duration = Duration::from_secs(10);

/// The three locks under test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Redbaton,
    RedlockCrate,
    Rslock,
}

impl Peer {
    const ALL: [Peer; 3] = [Peer::Redbaton, Peer::RedlockCrate, Peer::Rslock];

    fn name(self) -> &'static str {
        match self {
            Peer::Redbaton => "redbaton",
            Peer::RedlockCrate => "redlock crate",
            Peer::Rslock => "rslock",
        }
    }

    /// The peer's name on a child's command line.
    fn tag(self) -> &'static str {
        match self {
            Peer::Redbaton => "redbaton",
            Peer::RedlockCrate => "redlock",
            Peer::Rslock => "rslock",
        }
    }

    fn from_tag(tag: &str) -> Peer {
        Peer::ALL
            .into_iter()
            .find(|peer| peer.tag() == tag)
            .unwrap_or_else(|| panic!("unknown peer {tag}"))
    }

    /// Timed rounds of the uncontended cycle.
    fn cycle_rounds(self) -> usize {
        match self {
            Peer::RedlockCrate => PEER_ROUNDS,
            Peer::Redbaton | Peer::Rslock => ROUNDS,
        }
    }
}

/// A redbaton client on all of `urls` as independent masters.
fn quorum_client(urls: &[String]) -> Client {
    Client::builder(Topology::masters(urls))
        .build()
        .expect("quorum client")
}

/// The current-thread tokio runtime a thread drives rslock with.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// One thread's handle on one lock of one peer: `take` asks until it holds
/// the lock (redbaton parks; the crates sleep-retry until acquired) and
/// `give` lets it go.
enum Taker {
    Redbaton {
        /// Kept for as long as the lock is used.
        _client: Client,
        lock: redbaton::Lock,
    },
    RedlockCrate {
        manager: redlock::RedLock,
        name: Vec<u8>,
        ttl_ms: usize,
    },
    Rslock {
        runtime: Runtime,
        manager: rslock::LockManager,
        name: Vec<u8>,
        ttl: Duration,
    },
}

/// A lock `Taker::take` got.
enum Held<'a> {
    Redbaton(redbaton::LockGuard),
    RedlockCrate(redlock::Lock<'a>),
    Rslock(rslock::Lock),
}

impl Taker {
    /// `peer`'s lock `name` on the masters `urls`, with a fixed lease (TTL)
    /// of `lease` if given (else redbaton's default, renewed, lease and the
    /// crates' `PEER_TTL`). redbaton's lock is on `client` if given, else on
    /// a client of its own; the crates always get a manager of their own.
    fn new(
        peer: Peer,
        urls: &[String],
        name: &str,
        client: Option<&Client>,
        lease: Option<Duration>,
    ) -> Taker {
        let ttl = lease.unwrap_or(PEER_TTL);
        match peer {
            Peer::Redbaton => {
                let client = client.cloned().unwrap_or_else(|| quorum_client(urls));
                let mut lock = client.lock(name).expect("lock name");
                if let Some(lease) = lease {
                    lock = lock.with_fixed_lease(lease).expect("fixed lease");
                }
                Taker::Redbaton {
                    _client: client,
                    lock,
                }
            }
            Peer::RedlockCrate => Taker::RedlockCrate {
                manager: redlock::RedLock::new(urls.to_vec()),
                name: name.as_bytes().to_vec(),
                ttl_ms: ttl.as_millis() as usize,
            },
            Peer::Rslock => {
                let runtime = runtime();
                // Opens no connection yet: the first `lock` does, on this
                // thread's runtime.
                let manager = rslock::LockManager::new(urls.to_vec());
                Taker::Rslock {
                    runtime,
                    manager,
                    name: name.as_bytes().to_vec(),
                    ttl,
                }
            }
        }
    }

    /// Asks until the lock is held. "Held by another" answers are retried
    /// (the crates' `Ok(None)` and `Unavailable`, each after their own
    /// sleeping retries); any other failure is returned.
    fn take(&self) -> Result<Held<'_>, String> {
        match self {
            Taker::Redbaton { lock, .. } => lock
                .lock()
                .map(Held::Redbaton)
                .map_err(|err| format!("lock: {err}")),
            // What `RedLock::acquire` does, without the guard that borrows.
            Taker::RedlockCrate {
                manager,
                name,
                ttl_ms,
            } => loop {
                match manager.lock(name, *ttl_ms) {
                    Ok(Some(lock)) => return Ok(Held::RedlockCrate(lock)),
                    Ok(None) => {}
                    Err(err) => return Err(format!("lock: {err}")),
                }
            },
            // What `LockManager::acquire` does, without retrying errors
            // other than `Unavailable` silently.
            Taker::Rslock {
                runtime,
                manager,
                name,
                ttl,
            } => runtime.block_on(async {
                loop {
                    match manager.lock(name, *ttl).await {
                        Ok(lock) => return Ok(Held::Rslock(lock)),
                        Err(rslock::LockError::Unavailable) => {}
                        Err(err) => return Err(format!("lock: {err}")),
                    }
                }
            }),
        }
    }

    /// Releases `held` (the crates' release is best effort and reports
    /// nothing).
    fn give(&self, held: Held<'_>) -> Result<(), String> {
        match (self, held) {
            (Taker::Redbaton { .. }, Held::Redbaton(guard)) => {
                guard.unlock().map_err(|err| format!("unlock: {err}"))
            }
            (Taker::RedlockCrate { manager, .. }, Held::RedlockCrate(lock)) => {
                manager.unlock(&lock);
                Ok(())
            }
            (
                Taker::Rslock {
                    runtime, manager, ..
                },
                Held::Rslock(lock),
            ) => {
                runtime.block_on(manager.unlock(&lock));
                Ok(())
            }
            _ => unreachable!("a lock given back to another peer"),
        }
    }

    /// One uncontended lock + unlock.
    fn cycle(&self) {
        let held = self.take().expect("uncontended lock");
        self.give(held).expect("uncontended unlock");
    }
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

/// Nanoseconds on the wall clock (CLOCK_REALTIME): comparable between the
/// processes of one machine.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Microseconds, with one decimal below 1 ms.
fn us_text(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", us(d))
    } else {
        format!("{:.0} µs", us(d))
    }
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

/// `peer`'s lock for the uncontended cycles, on `urls`.
fn uncontended_taker(peer: Peer, urls: &[String]) -> Taker {
    let name = format!("bench:redlock:uncontended:{}", peer.tag());
    Taker::new(peer, urls, &name, None, None)
}

/// The median uncontended lock + unlock of `peer` on `urls`.
fn uncontended_cycle(peer: Peer, urls: &[String]) -> Duration {
    let taker = uncontended_taker(peer, urls);
    median(peer.cycle_rounds(), || taker.cycle())
}

/// [`uncontended_cycle`], and the masters' CPU time per cycle (all
/// masters' main threads together, `INFO cpu`, over every cycle run,
/// untimed ones too): where a cycle's time goes that the client does not
/// spend, on a machine whose cores the masters share. Every master must
/// answer.
fn uncontended_cycle_costs(peer: Peer, urls: &[String]) -> (Duration, Duration) {
    let taker = uncontended_taker(peer, urls);
    let mut cycles: u32 = 0;
    let before = masters_cpu(urls);
    let cycle = median(peer.cycle_rounds(), || {
        cycles += 1;
        taker.cycle();
    });
    let spent = masters_cpu(urls).saturating_sub(before);
    (cycle, spent / cycles.max(1))
}

/// The CPU time the main threads of the masters at `urls` have used.
fn masters_cpu(urls: &[String]) -> Duration {
    urls.iter()
        .map(|url| {
            let info: String = redis::Client::open(url.as_str())
                .and_then(|client| client.get_connection())
                .and_then(|mut conn| redis::cmd("INFO").arg("cpu").query(&mut conn))
                .expect("INFO cpu");
            let seconds: f64 = info
                .lines()
                .filter_map(|line| {
                    let (field, value) = line.trim().split_once(':')?;
                    let main_thread =
                        field == "used_cpu_sys_main_thread" || field == "used_cpu_user_main_thread";
                    main_thread.then(|| value.parse::<f64>().ok()).flatten()
                })
                .sum();
            Duration::from_secs_f64(seconds)
        })
        .sum()
}

/// One acquisition in a contended run: when the thread asked, got the lock
/// and let it go.
#[derive(Clone, Copy, Debug)]
struct Event {
    thread: usize,
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
    /// The share of acquisitions by the thread that held the lock just
    /// before (no hand-off to another thread).
    same_again: f64,
    /// Failed `take` or `give` calls (the thread asks again), and the first
    /// error.
    errors: usize,
    first_error: Option<String>,
}

/// `CONTENDERS` threads of one process take turns on one lock until
/// `CONTENDED_RUN` has passed; empty critical section. redbaton's threads
/// share one client; each thread of a crate has a manager of its own.
fn contend(peer: Peer, urls: &[String]) -> Contended {
    let name = format!("bench:redlock:contended:{}", peer.tag());
    let client = (peer == Peer::Redbaton).then(|| quorum_client(urls));
    let start = Arc::new(Barrier::new(CONTENDERS + 1));
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|thread| {
            let (client, start, urls, name) = (
                client.clone(),
                Arc::clone(&start),
                urls.to_vec(),
                name.clone(),
            );
            thread::spawn(move || {
                let taker = Taker::new(peer, &urls, &name, client.as_ref(), None);
                let mut events = Vec::new();
                let mut errors = Vec::new();
                start.wait();
                let end = Instant::now() + CONTENDED_RUN;
                while Instant::now() < end {
                    let asked = Instant::now();
                    match taker.take() {
                        Ok(held) => {
                            let got = Instant::now();
                            let released = Instant::now();
                            if let Err(err) = taker.give(held) {
                                errors.push(err);
                            }
                            events.push(Event {
                                thread,
                                asked,
                                got,
                                released,
                            });
                        }
                        Err(err) => errors.push(err),
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
    let same_again = events
        .windows(2)
        .filter(|pair| pair[1].thread == pair[0].thread)
        .count() as f64
        / events.len().max(1) as f64;
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
        same_again,
        errors: errors.len(),
        first_error: errors.into_iter().next(),
    }
}

/// What a hand-off run showed.
struct Handoff {
    /// Release → the waiting child's acquisition, sorted.
    times: Vec<Duration>,
    /// Timed rounds in which the child had not asked yet when the parent
    /// let go (no hand-off).
    not_waiting: usize,
    /// Errors on either side (each side asks again), and the first one.
    errors: usize,
    first_error: Option<String>,
    /// Why the run ended early, if it did.
    failure: Option<String>,
}

impl Handoff {
    fn error(&mut self, err: String) {
        self.errors += 1;
        self.first_error.get_or_insert(err);
    }

    fn at(&self, q: f64) -> Option<Duration> {
        let last = self.times.len().checked_sub(1)?;
        Some(self.times[(last as f64 * q).round() as usize])
    }
}

/// The hand-off run of `peer`: the parent (this thread, its own client)
/// holds the lock, the child process asks, the parent lets go.
fn handoff(peer: Peer, urls: &[String]) -> Handoff {
    let name = format!("bench:redlock:handoff:{}", peer.tag());
    let mut run = Handoff {
        times: Vec::new(),
        not_waiting: 0,
        errors: 0,
        first_error: None,
        failure: None,
    };
    let holder = Taker::new(peer, urls, &name, None, None);
    for _ in 0..HANDOFF_WARM_UP {
        holder.cycle();
    }
    let mut child = Command::new(env::current_exe().expect("current exe"))
        .args(["--child", "handoff", peer.tag(), &name])
        .args(urls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hand-off child");
    let mut to_child = child.stdin.take().expect("child stdin");
    let mut from_child = BufReader::new(child.stdout.take().expect("child stdout")).lines();
    if from_child.next().and_then(Result::ok).as_deref() != Some("READY") {
        run.failure = Some("the child did not start".to_owned());
    }
    for round in 0..HANDOFF_WARM_UP + HANDOFFS {
        if run.failure.is_some() {
            break;
        }
        // Free: the child let go before it reported its turn.
        let held = match holder.take() {
            Ok(held) => held,
            Err(err) => {
                run.error(format!("holder: {err}"));
                continue;
            }
        };
        if writeln!(to_child, "GO")
            .and_then(|()| to_child.flush())
            .is_err()
        {
            run.failure = Some("the child is gone".to_owned());
            drop(holder.give(held));
            break;
        }
        thread::sleep(HANDOFF_HOLD);
        let released = now_ns();
        if let Err(err) = holder.give(held) {
            run.error(format!("holder: {err}"));
        }
        let turn = loop {
            match from_child.next().and_then(Result::ok) {
                Some(line) => match line.strip_prefix("ERR ") {
                    Some(err) => run.error(format!("waiter: {err}")),
                    None => {
                        let n: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
                        break n.get(0..2).map(|n| (n[0], n[1]));
                    }
                },
                None => break None,
            }
        };
        let Some((asked, got)) = turn else {
            run.failure = Some(format!("the child ended in round {round}"));
            break;
        };
        if round < HANDOFF_WARM_UP {
            continue;
        }
        if asked < released {
            run.times
                .push(Duration::from_nanos(got.saturating_sub(released)));
        } else {
            run.not_waiting += 1;
        }
    }
    drop(to_child);
    match child.wait() {
        Ok(status) if !status.success() => {
            run.failure
                .get_or_insert(format!("the child exited with {status}"));
        }
        Ok(_) => {}
        Err(err) => {
            run.failure.get_or_insert(format!("the child: {err}"));
        }
    }
    run.times.sort_unstable();
    run
}

/// The hand-off child: its own client on lock `name`; on each `GO` from the
/// parent it asks for the lock (the parent holds it), and once it has it,
/// lets go and prints when it asked and got it. Ends when stdin does.
fn run_handoff_child(peer: Peer, name: &str, urls: &[String]) {
    let waiter = Taker::new(peer, urls, name, None, None);
    for _ in 0..HANDOFF_WARM_UP {
        waiter.cycle();
    }
    println!("READY");
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if line != "GO" {
            break;
        }
        let asked = now_ns();
        let mut errors = 0;
        let held = loop {
            match waiter.take() {
                Ok(held) => break held,
                Err(err) => {
                    println!("ERR {}", err.replace('\n', " "));
                    errors += 1;
                    assert!(
                        errors < HANDOFF_MAX_ERRORS,
                        "hand-off child: {errors} errors in one wait"
                    );
                }
            }
        };
        let got = now_ns();
        if let Err(err) = waiter.give(held) {
            println!("ERR {}", err.replace('\n', " "));
        }
        println!("{asked} {got}");
    }
}

/// One crash-recovery run: a holder that takes the lock with a
/// `CRASH_LEASE` lease and never releases it, then a waiter on another
/// client. Milliseconds from the end of the lease (the holder's acquisition
/// plus `CRASH_LEASE`) to the waiter's acquisition; negative if the waiter
/// got in before.
fn crash_recovery(peer: Peer, urls: &[String], round: usize) -> f64 {
    let name = format!("bench:redlock:crash:{}:{round}", peer.tag());
    let holder = Taker::new(peer, urls, &name, None, Some(CRASH_LEASE));
    let waiter = Taker::new(peer, urls, &name, None, None);
    let held = holder.take().expect("holder");
    let lease_end = Instant::now() + CRASH_LEASE;
    // The holder "crashes": its lock is never released (the crates' locks
    // release nothing when dropped; redbaton's guard would).
    std::mem::forget(held);
    let got = waiter.take().expect("waiter");
    let got_at = Instant::now();
    waiter.give(got).expect("waiter's unlock");
    drop(holder);
    match got_at.checked_duration_since(lease_end) {
        Some(late) => ms(late),
        None => -ms(lease_end.duration_since(got_at)),
    }
}

fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A multiple of `PING`, with fewer decimals as it grows.
fn times_ping(x: f64) -> String {
    if x.abs() < 10.0 {
        format!("{x:.2} ×")
    } else if x.abs() < 100.0 {
        format!("{x:.1} ×")
    } else {
        format!("{x:.0} ×")
    }
}

/// The peers with the lowest `score` (None: not ranked), joined.
fn best(scores: &[Option<f64>]) -> String {
    let low = scores
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    if !low.is_finite() {
        return "none".to_owned();
    }
    Peer::ALL
        .iter()
        .zip(scores)
        .filter(|(_, s)| **s == Some(low))
        .map(|(peer, _)| peer.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prints `rows` as a table: columns padded to their widest cell, a rule
/// under the first row.
fn print_table(prefix: &str, rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &w)| format!("{cell:<w$}"))
            .collect();
        println!("{prefix} {}", cells.join(" | ").trim_end());
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
            println!("{prefix} {}", rule.join("-+-"));
        }
    }
}

fn figures(masters: usize) {
    let servers: Vec<RedisServer> = (0..masters).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let n = format!("N={masters}");

    let ping = ping_median(&mut servers[0].connection());
    let x = |d: Duration| times_ping(ratio(d, ping));
    println!(
        "{n} PING (one master, raw connection, median of {ROUNDS}): {:.1} µs",
        us(ping)
    );

    let (cycles, masters_cpu): (Vec<Duration>, Vec<Duration>) = Peer::ALL
        .iter()
        .map(|&peer| uncontended_cycle_costs(peer, &urls))
        .unzip();
    let runs: Vec<Contended> = Peer::ALL.iter().map(|&peer| contend(peer, &urls)).collect();
    let handoffs: Vec<Handoff> = Peer::ALL.iter().map(|&peer| handoff(peer, &urls)).collect();
    let recoveries: Vec<Vec<f64>> = Peer::ALL
        .iter()
        .map(|&peer| {
            (1..=CRASH_RUNS)
                .map(|round| crash_recovery(peer, &urls, round))
                .collect()
        })
        .collect();
    let recovery_medians: Vec<f64> = recoveries.iter().map(|r| median_f64(r.clone())).collect();

    let mut rows = vec![vec![
        "peer".to_owned(),
        "uncontended cycle".to_owned(),
        format!("contended ({CONTENDERS} threads): acq/s"),
        "longest wait".to_owned(),
        "hand-off to another worker".to_owned(),
        "crash recovery".to_owned(),
    ]];
    for (i, peer) in Peer::ALL.iter().enumerate() {
        let run = &runs[i];
        let mark = if run.overlaps > 0 { " OVERLAPS" } else { "" };
        let per_acq = Duration::from_secs_f64(1.0 / run.per_second.max(1e-9));
        let handoff = match (handoffs[i].at(0.5), &handoffs[i].failure) {
            (Some(h), None) => format!("{} = {}", us_text(h), x(h)),
            (Some(h), Some(_)) => format!("{} = {} (cut short)", us_text(h), x(h)),
            (None, _) => "failed".to_owned(),
        };
        let recovery = recovery_medians[i];
        rows.push(vec![
            peer.name().to_owned(),
            format!("{} = {}", us_text(cycles[i]), x(cycles[i])),
            if run.acquisitions == 0 {
                "failed".to_owned()
            } else {
                format!("{:.0}/s = {} per acq{mark}", run.per_second, x(per_acq))
            },
            format!("{:.1} ms = {}", ms(run.longest_wait), x(run.longest_wait)),
            handoff,
            format!(
                "{recovery:.1} ms = {}",
                times_ping(recovery / 1e3 / ping.as_secs_f64())
            ),
        ]);
    }
    let ranked = |i: usize| runs[i].overlaps == 0 && runs[i].acquisitions > 0;
    let idx = 0..Peer::ALL.len();
    rows.push(vec![
        "best".to_owned(),
        best(
            &idx.clone()
                .map(|i| Some(cycles[i].as_secs_f64()))
                .collect::<Vec<_>>(),
        ),
        best(
            &idx.clone()
                .map(|i| ranked(i).then_some(-runs[i].per_second))
                .collect::<Vec<_>>(),
        ),
        best(
            &idx.clone()
                .map(|i| ranked(i).then_some(runs[i].longest_wait.as_secs_f64()))
                .collect::<Vec<_>>(),
        ),
        best(
            &idx.clone()
                .map(|i| handoffs[i].at(0.5).map(|h| h.as_secs_f64()))
                .collect::<Vec<_>>(),
        ),
        best(
            &idx.map(|i| (recovery_medians[i] >= 0.0).then_some(recovery_medians[i]))
                .collect::<Vec<_>>(),
        ),
    ]);
    println!(
        "{n} each figure also as a multiple of that PING; contended throughput as the mean time per acquisition"
    );
    print_table(&n, &rows);

    let goal = if masters == GOAL_MASTERS {
        format!(
            "redbaton's goal ≤ {GOAL} × PING: {}",
            verdict(ratio(cycles[0], ping), GOAL)
        )
    } else {
        format!("(redbaton's goal ≤ {GOAL} × PING is for {GOAL_MASTERS} masters)")
    };
    println!("{n}   uncontended cycle: median of {ROUNDS} (redlock crate: {PEER_ROUNDS}) — {goal}");
    let spent: Vec<String> = Peer::ALL
        .iter()
        .zip(&masters_cpu)
        .map(|(peer, cpu)| format!("{} {:.1} µs", peer.name(), us(*cpu)))
        .collect();
    println!(
        "{n}   uncontended cycle, the masters' CPU per cycle (all {masters} together): {}",
        spent.join(", ")
    );
    for (peer, run) in Peer::ALL.iter().zip(&runs) {
        println!(
            "{n}   contended, {}: {} acquisitions in {CONTENDED_RUN:?}, same thread again {:.1} %, {} overlaps, {} errors{}",
            peer.name(),
            run.acquisitions,
            run.same_again * 100.0,
            run.overlaps,
            run.errors,
            run.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
    }
    let opt_us = |d: Option<Duration>| d.map_or("-".to_owned(), us_text);
    for (peer, h) in Peer::ALL.iter().zip(&handoffs) {
        println!(
            "{n}   hand-off, {}: {} hand-offs (median, p90, max {} / {} / {}), {} rounds not waiting yet, {} errors{}{}",
            peer.name(),
            h.times.len(),
            opt_us(h.at(0.5)),
            opt_us(h.at(0.9)),
            opt_us(h.at(1.0)),
            h.not_waiting,
            h.errors,
            h.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
            h.failure
                .as_ref()
                .map(|f| format!("; FAILED: {f}"))
                .unwrap_or_default()
        );
    }
    let list = |runs: &[f64]| {
        runs.iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let crash: Vec<String> = Peer::ALL
        .iter()
        .zip(&recoveries)
        .map(|(peer, runs)| format!("{} {} ms", peer.name(), list(runs)))
        .collect();
    println!(
        "{n}   crash recovery ({CRASH_LEASE:?} lease never released; lease end → waiter's acquisition), runs: {}",
        crash.join("; ")
    );

    // A degraded quorum: as many masters stopped as a majority can do
    // without (SIGSTOP: the kernel accepts connections, the server never
    // answers). The first round to meet them waits one node timeout; the
    // later ones leave them out while a probe waits for them.
    let stopped = (masters - 1) / 2;
    for server in &servers[masters - stopped..] {
        server.pause();
    }
    let degraded = uncontended_cycle(Peer::Redbaton, &urls);
    for server in &servers[masters - stopped..] {
        server.resume();
    }
    println!(
        "{n}   redbaton with {stopped} of {masters} masters stopped: uncontended cycle {} = {}, {:.2} × its healthy cycle above",
        us_text(degraded),
        x(degraded),
        degraded.as_secs_f64() / cycles[0].as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = env::args().skip_while(|a| a != "--child").skip(1).collect();
    if let [role, peer, name, urls @ ..] = &args[..] {
        assert_eq!(role, "handoff", "unknown child role {role}");
        return run_handoff_child(Peer::from_tag(peer), name, urls);
    }
    let started = Instant::now();
    println!("redbaton Redlock benchmarks: redbaton (Topology::masters) vs the redlock crate 2 and rslock 0.10 (tokio, a current-thread runtime per thread), on local independent masters\n");
    for (i, masters) in MASTER_COUNTS.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        figures(masters);
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
}

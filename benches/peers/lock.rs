//! redbaton's figures, each as a ratio to the Redis round trip (PING on one
//! connection) measured in the same run, and against the `redlock` crate (a
//! widely used sync Rust Redis lock) on the same server in the same run.
//!
//! ```text
//! cargo bench --manifest-path benches/peers/Cargo.toml --bench lock
//! cargo bench --manifest-path benches/peers/Cargo.toml --bench lock -- --uncontended-only
//! cargo bench --manifest-path benches/peers/Cargo.toml --bench lock -- --contended-only
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise a throwaway `redis-server` from PATH.
//! `LOCK_BENCH_PAUSE_US` has each thread of the contended runs sleep that
//! long between two holds (demand that comes and goes, under which the lock
//! is often free when asked for); by default it asks again at once.
//! Absolute times are noisy (a shared 2-core VM here); the ratios are what to
//! compare. Mutual exclusion is checked in every contended run, for both
//! locks: no two holders' intervals may overlap.

use std::collections::BTreeMap;
use std::env;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redbaton::Client;

#[path = "floor.rs"]
mod floor;
#[path = "turns.rs"]
mod turns;
use floor::{FencedFloorLock, FloorLock};

const CONTENDED_RUN: Duration = Duration::from_secs(3);
const WAITERS: usize = 20;
const HOLD: Duration = Duration::from_secs(5);
const MAX_PARK: Duration = Duration::from_secs(2);

/// Nanoseconds on the wall clock: comparable between processes of one machine.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The two locks under test, behind one shape.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Redbaton,
    /// redbaton's fair lock (the contended runs only).
    Fair,
    Redlock,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Redbaton => "redbaton",
            Peer::Fair => "fair",
            Peer::Redlock => "redlock",
        }
    }
    fn parse(s: &str) -> Peer {
        if s == "redlock" {
            Peer::Redlock
        } else if s == "fair" {
            Peer::Fair
        } else {
            Peer::Redbaton
        }
    }
}

/// One acquisition: who, when it started waiting, got it, and let it go.
#[derive(Clone, Copy, Debug)]
struct Event {
    holder: u64,
    asked: u64,
    got: u64,
    released: u64,
}

/// How long each thread of a contended run sleeps between two holds
/// (`LOCK_BENCH_PAUSE_US`; none by default).
fn pause_between_holds() -> Option<Duration> {
    env::var("LOCK_BENCH_PAUSE_US")
        .ok()
        .and_then(|micros| micros.parse().ok())
        .map(Duration::from_micros)
}

/// Runs `threads` threads of `peer` on one lock until `run` has passed;
/// `tag` tells this process's threads from another's.
fn contend(peer: Peer, url: &str, threads: usize, run: Duration, tag: u64) -> Vec<Event> {
    let pause = pause_between_holds();
    let client = Client::open(url).expect("valid URL");
    let redlock = Arc::new(redlock::RedLock::new(vec![url]));
    let start = Arc::new(Barrier::new(threads));
    let end = Instant::now() + run + Duration::from_millis(200);
    let handles: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (client, redlock, start) =
                (client.clone(), Arc::clone(&redlock), Arc::clone(&start));
            thread::spawn(move || {
                // The fair lock is a `Lock` too, on a name of its own.
                let lock = match peer {
                    Peer::Fair => client.fair_lock("bench:contended:fair"),
                    _ => client.lock("bench:contended"),
                }
                .expect("name");
                let mut events = Vec::new();
                start.wait();
                while Instant::now() < end {
                    let asked = now_ns();
                    match peer {
                        Peer::Redbaton | Peer::Fair => {
                            let guard = lock.lock().expect("lock");
                            let got = now_ns();
                            let released = now_ns();
                            guard.unlock().expect("unlock");
                            events.push(Event {
                                holder: tag * 1000 + t,
                                asked,
                                got,
                                released,
                            });
                        }
                        Peer::Redlock => {
                            let held = redlock.acquire(b"bench:redlock", 10_000).expect("redlock");
                            let got = now_ns();
                            let released = now_ns();
                            drop(held);
                            events.push(Event {
                                holder: tag * 1000 + t,
                                asked,
                                got,
                                released,
                            });
                        }
                    }
                    if let Some(pause) = pause {
                        thread::sleep(pause);
                    }
                }
                events
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect()
}

/// What a contended run showed.
struct Contended {
    per_second: f64,
    handoff_p50: Duration,
    handoff_p99: Duration,
    same_again: f64,
    longest_wait: Duration,
    overlaps: usize,
    /// p50 of the hand-offs from one process to the other (None in one
    /// process).
    across_p50: Option<Duration>,
}

fn analyse(mut events: Vec<Event>, run: Duration) -> Contended {
    events.sort_by_key(|e| e.got);
    let mut handoffs: Vec<u64> = Vec::new();
    let mut across: Vec<u64> = Vec::new();
    let (mut same, mut overlaps) = (0, 0);
    for pair in events.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.got < a.released {
            overlaps += 1;
        }
        if b.holder == a.holder {
            same += 1;
        }
        // A hand-off: the next holder was already waiting when this one let go.
        if b.asked < a.released {
            handoffs.push(b.got.saturating_sub(a.released));
            if a.holder / 1000 != b.holder / 1000 {
                across.push(b.got.saturating_sub(a.released));
            }
        }
    }
    across.sort_unstable();
    handoffs.sort_unstable();
    let pick = |q: f64| {
        Duration::from_nanos(
            handoffs
                .get(((handoffs.len() as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or(0),
        )
    };
    Contended {
        per_second: events.len() as f64 / run.as_secs_f64(),
        handoff_p50: pick(0.5),
        handoff_p99: pick(0.99),
        same_again: same as f64 / events.len().max(1) as f64,
        longest_wait: Duration::from_nanos(
            events.iter().map(|e| e.got - e.asked).max().unwrap_or(0),
        ),
        overlaps,
        across_p50: across
            .get(across.len() / 2)
            .map(|n| Duration::from_nanos(*n)),
    }
}

/// This bench binary again, as a child process.
fn child(args: &[&str]) -> Child {
    Command::new(env::current_exe().expect("exe"))
        .arg("--child")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn")
}

fn lines(child: &mut Child) -> impl Iterator<Item = String> + '_ {
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .lines()
        .map_while(Result::ok)
}

fn contended_across_processes(peer: Peer, url: &str, processes: u64) -> Contended {
    let secs = CONTENDED_RUN.as_millis().to_string();
    let mut children: Vec<Child> = (1..=processes)
        .map(|tag| child(&["contend", peer.name(), url, &secs, &tag.to_string()]))
        .collect();
    let mut events = Vec::new();
    for c in &mut children {
        for line in lines(c) {
            let n: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [holder, asked, got, released] = n[..] {
                events.push(Event {
                    holder,
                    asked,
                    got,
                    released,
                });
            }
        }
        c.wait().expect("child");
    }
    analyse(events, CONTENDED_RUN)
}

/// Median time of one call of `f`.
fn median(rounds: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..rounds / 10 {
        f();
    }
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[rounds / 2]
}

/// Median time of one call of each of `fs`, run in turns (a block of
/// each, five times over) so that a busy moment of the machine weighs on
/// all of them alike.
fn interleaved_medians(rounds: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<Duration> {
    const BLOCKS: usize = 5;
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); fs.len()];
    for f in fs.iter_mut() {
        for _ in 0..rounds / 10 {
            f();
        }
    }
    for _ in 0..BLOCKS {
        for (f, times) in fs.iter_mut().zip(&mut times) {
            for _ in 0..rounds / BLOCKS {
                let start = Instant::now();
                f();
                times.push(start.elapsed());
            }
        }
    }
    times
        .into_iter()
        .map(|mut times| {
            times.sort_unstable();
            times[times.len() / 2]
        })
        .collect()
}

/// The lease of the killed holder in the crash-recovery runs.
const CRASH_LEASE: Duration = Duration::from_secs(1);

/// From the end of a killed holder's lease to a waiter's acquisition, for
/// a waiter that starts `phase` (0.0 to 1.0) into the lease; one run.
fn crash_recovery(peer: Peer, url: &str, round: usize, phase: f64) -> Duration {
    let mut holder = child(&["hold", peer.name(), url, &round.to_string()]);
    let acquired: u64 = lines(&mut holder)
        .next()
        .and_then(|l| l.parse().ok())
        .expect("holder");
    holder.kill().expect("kill");
    holder.wait().expect("reap");
    let lease_ns = CRASH_LEASE.as_nanos() as u64;
    let start_at = acquired + (lease_ns as f64 * phase) as u64;
    thread::sleep(Duration::from_nanos(start_at.saturating_sub(now_ns())));
    let client = Client::open(url).expect("url");
    let name = format!("bench:crash:{round}");
    match peer {
        Peer::Fair => unreachable!("the fair lock runs in the contended runs only"),
        Peer::Redbaton => drop(client.lock(&name).expect("name").lock().expect("lock")),
        Peer::Redlock => {
            let redlock = redlock::RedLock::new(vec![url]);
            drop(redlock.acquire(name.as_bytes(), 10_000).expect("redlock"));
        }
    }
    Duration::from_nanos(now_ns().saturating_sub(acquired + lease_ns))
}

/// How far past their deadline timed-out waits return: 90 `try_lock_for`
/// of 10 to 300 ms on a held lock; (p50, p99, max).
fn deadline_overshoot(url: &str) -> (Duration, Duration, Duration) {
    let holder = Client::open(url).expect("url");
    let _held = holder
        .lock("bench:deadline")
        .expect("name")
        .lock()
        .expect("lock");
    let waiter = Client::open(url).expect("url");
    let lock = waiter.lock("bench:deadline").expect("name");
    let mut overshoots: Vec<Duration> = (0..90u64)
        .map(|i| {
            let wait = Duration::from_millis(10 + (i * 290) / 89);
            let started = Instant::now();
            assert!(lock.try_lock_for(wait).expect("wait").is_none());
            started.elapsed().saturating_sub(wait)
        })
        .collect();
    overshoots.sort_unstable();
    (overshoots[45], overshoots[89 * 99 / 100], overshoots[89])
}

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|x| x.parse::<u64>().ok()).sum());
    Duration::from_millis(ticks * 10)
}

fn commands(raw: &mut redis::Connection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(raw)
        .expect("INFO");
    testkit::parse_commandstats(&info)
}

/// Commands per waiter per second and CPU of 20 waiters during a 5 s hold.
fn waiting_cost(peer: Peer, url: &str, raw: &mut redis::Connection) -> (f64, Duration) {
    let name = format!("bench:waiting:{}", peer.name());
    let client = Client::open(url).expect("url");
    let redlock = redlock::RedLock::new(vec![url]);
    let (held_redbaton, held_redlock) = match peer {
        Peer::Fair => unreachable!("the fair lock runs in the contended runs only"),
        Peer::Redbaton => (
            Some(client.lock(&name).expect("name").lock().expect("lock")),
            None,
        ),
        Peer::Redlock => (
            None,
            Some(redlock.acquire(name.as_bytes(), 60_000).expect("redlock")),
        ),
    };
    let mut waiters = child(&["wait", peer.name(), url, &name]);
    let ready = lines(&mut waiters).next();
    assert_eq!(ready.as_deref(), Some("WAITING"));
    // Past the start-up (each thread's identity INCR and first attempt):
    // what waiting costs while the lock stays held.
    thread::sleep(Duration::from_millis(500));
    let before = commands(raw);
    thread::sleep(HOLD);
    let after = commands(raw);
    drop(held_redbaton);
    drop(held_redlock);
    let cpu: u64 = lines(&mut waiters)
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    waiters.wait().expect("child");
    // What the clients sent; commands run inside scripts cost no round trip
    // and are not counted (redbaton's scripts call GET and SET themselves).
    let sent: &[&str] = match peer {
        Peer::Fair => unreachable!("the fair lock runs in the contended runs only"),
        Peer::Redbaton => &[
            "evalsha",
            "eval",
            "script|load",
            "blpop",
            "incr",
            "exists",
            "client|id",
            "client|unblock",
            "config|get",
        ],
        Peer::Redlock => &["evalsha", "eval", "script|load", "set", "get", "del"],
    };
    let total: u64 = sent
        .iter()
        .map(|c| after.get(*c).unwrap_or(&0) - before.get(*c).unwrap_or(&0))
        .sum();
    (
        total as f64 / WAITERS as f64 / HOLD.as_secs_f64(),
        Duration::from_millis(cpu),
    )
}

fn run_child(args: &[String]) {
    let peer = Peer::parse(&args[1]);
    let url = &args[2];
    match args[0].as_str() {
        "contend" => {
            let run = Duration::from_millis(args[3].parse().expect("ms"));
            let tag: u64 = args[4].parse().expect("tag");
            for e in contend(peer, url, 8, run, tag) {
                println!("{} {} {} {}", e.holder, e.asked, e.got, e.released);
            }
        }
        "hold" => {
            let name = format!("bench:crash:{}", args[3]);
            match peer {
                Peer::Fair => unreachable!("the fair lock runs in the contended runs only"),
                Peer::Redbaton => {
                    let client = Client::open(url).expect("url");
                    let lock = client
                        .lock(&name)
                        .expect("name")
                        .with_fixed_lease(CRASH_LEASE)
                        .expect("lease");
                    let _guard = lock.lock().expect("lock");
                    println!("{}", now_ns());
                    thread::sleep(Duration::from_secs(30));
                }
                Peer::Redlock => {
                    let redlock = redlock::RedLock::new(vec![url.as_str()]);
                    let lease = CRASH_LEASE.as_millis() as usize;
                    let _held = redlock.lock(name.as_bytes(), lease).expect("redlock");
                    println!("{}", now_ns());
                    thread::sleep(Duration::from_secs(30));
                }
            }
        }
        "wait" => {
            let name = args[3].clone();
            let client = Client::builder(url)
                .max_park(MAX_PARK)
                .build()
                .expect("url");
            let redlock = Arc::new(redlock::RedLock::new(vec![url.as_str()]));
            let done = Arc::new(AtomicBool::new(false));
            let cpu_before = cpu_time();
            let handles: Vec<_> = (0..WAITERS)
                .map(|_| {
                    let (client, redlock, name, done) = (
                        client.clone(),
                        Arc::clone(&redlock),
                        name.clone(),
                        Arc::clone(&done),
                    );
                    thread::spawn(move || match peer {
                        Peer::Fair => unreachable!("the fair lock runs in the contended runs only"),
                        Peer::Redbaton => {
                            drop(client.lock(&name).expect("name").lock().expect("lock"))
                        }
                        Peer::Redlock => {
                            while !done.load(Ordering::Relaxed) {
                                if let Some(l) =
                                    redlock.lock(name.as_bytes(), 1_000).expect("redlock")
                                {
                                    redlock.unlock(&l);
                                    break;
                                }
                            }
                        }
                    })
                })
                .collect();
            println!("WAITING");
            thread::sleep(HOLD);
            let cpu = cpu_time() - cpu_before;
            done.store(true, Ordering::Relaxed);
            for h in handles {
                h.join().expect("waiter");
            }
            println!("{}", cpu.as_millis());
        }
        other => panic!("unknown child role {other}"),
    }
}

fn main() {
    let args: Vec<String> = env::args().skip_while(|a| a != "--child").skip(1).collect();
    if !args.is_empty() {
        return run_child(&args);
    }
    // Keeps a throwaway server alive until the end of main.
    let redis = testkit::DemoRedis::from_env().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(1)
    });
    let url = redis.url.clone();
    let mut raw = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let rtt = median(5_000, || {
        redis::cmd("PING")
            .query::<String>(&mut raw)
            .map(drop)
            .expect("PING")
    });
    let x = |d: Duration| d.as_secs_f64() / rtt.as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "redbaton benchmarks; Redis round trip (PING, median) = {:.1} µs\n",
        rtt.as_secs_f64() * 1e6
    );

    let client = Client::open(&url).expect("url");
    let lock = client.lock("bench:uncontended").expect("name");
    // The floor of any Redis lock: SET NX PX, then a compare-and-delete
    // script, on one connection; and the fenced floor: the same Redis calls
    // as redbaton's cycle (a fresh fenced acquisition's five, an
    // owner-checked delete's two), no other logic.
    let floor = FloorLock::new("bench:bare");
    let fenced = FencedFloorLock::new("bench:fenced");
    let mut raw_fenced = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let [cycle, bare_cycle, fenced_cycle] = interleaved_medians(
        5_000,
        &mut [
            &mut || lock.lock().expect("lock").unlock().expect("unlock"),
            &mut || floor.cycle(&mut raw),
            &mut || {
                fenced.cycle(&mut raw_fenced);
            },
        ],
    )[..] else {
        unreachable!("three medians")
    };
    // The same cycle with an event hook set (one that counts what it is
    // told), against the cycle without: what observing costs.
    let told = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = std::sync::Arc::clone(&told);
    let hooked = Client::builder(url.as_str())
        .on_event(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })
        .build()
        .expect("url");
    let hooked_lock = hooked.lock("bench:uncontended:hooked").expect("name");
    let hooked_cycle = median(5_000, || {
        hooked_lock.lock().expect("lock").unlock().expect("unlock")
    });
    // The same cycle with `metrics(false)`, to a recorder that keeps every
    // update (metrics-util's debugging recorder, installed globally): two
    // counters, two histograms and two gauge updates per cycle.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder");
    let metered = Client::builder(url.as_str())
        .metrics(false)
        .build()
        .expect("url");
    let metered_lock = metered.lock("bench:uncontended:metered").expect("name");
    let metered_cycle = median(5_000, || {
        metered_lock.lock().expect("lock").unlock().expect("unlock")
    });
    let recorded = snapshotter.snapshot().into_vec().len();
    let redlock = redlock::RedLock::new(vec![url.as_str()]);
    let peer_cycle = median(2_000, || {
        let l = redlock
            .lock(b"bench:uncontended:redlock", 10_000)
            .expect("redlock")
            .expect("free");
        redlock.unlock(&l);
    });
    println!(
        "uncontended lock + unlock: redbaton {:.1} µs = {:.2} x RTT = {:.2} x the bare floor = {:.2} x the fenced floor; bare SET NX + compare-and-delete {:.1} µs = {:.2} x RTT; fenced floor {:.1} µs = {:.2} x RTT; redlock {:.1} µs = {:.2} x RTT",
        cycle.as_secs_f64() * 1e6,
        x(cycle),
        cycle.as_secs_f64() / bare_cycle.as_secs_f64(),
        cycle.as_secs_f64() / fenced_cycle.as_secs_f64(),
        bare_cycle.as_secs_f64() * 1e6,
        x(bare_cycle),
        fenced_cycle.as_secs_f64() * 1e6,
        x(fenced_cycle),
        peer_cycle.as_secs_f64() * 1e6,
        x(peer_cycle)
    );
    println!(
        "uncontended lock + unlock with an event hook set: {:.1} µs = {:.2} x RTT, {:.2} x the cycle without ({} events told)",
        hooked_cycle.as_secs_f64() * 1e6,
        x(hooked_cycle),
        hooked_cycle.as_secs_f64() / cycle.as_secs_f64(),
        told.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!(
        "uncontended lock + unlock with metrics(false) to a recorder: {:.1} µs = {:.2} x RTT, {:.2} x the cycle without ({recorded} series)",
        metered_cycle.as_secs_f64() * 1e6,
        x(metered_cycle),
        metered_cycle.as_secs_f64() / cycle.as_secs_f64(),
    );
    // `-- --uncontended-only`: the rows above, without the contended runs.
    if env::args().any(|arg| arg == "--uncontended-only") {
        return;
    }
    contended(&url, rtt);
    // `-- --contended-only`: the uncontended cycle and the contended runs.
    if env::args().any(|arg| arg == "--contended-only") {
        return;
    }

    println!("\ncrash recovery (holder with a {CRASH_LEASE:?} fixed lease SIGKILLed; waiter starts at 0/40/80 % of the lease; lease end -> waiter's acquisition, 3 runs each):");
    for peer in [Peer::Redbaton, Peer::Redlock] {
        let mut round = 0;
        let mut all = Vec::new();
        let phases: Vec<String> = [0.0, 0.4, 0.8]
            .into_iter()
            .map(|phase| {
                let runs: Vec<String> = (0..3)
                    .map(|_| {
                        round += 1;
                        let delay = crash_recovery(peer, &url, round, phase);
                        all.push(delay);
                        format!("{:.1}", ms(delay))
                    })
                    .collect();
                format!("{:>3.0} %: {} ms", phase * 100.0, runs.join(" / "))
            })
            .collect();
        let worst = all.iter().max().copied().unwrap_or_default();
        println!(
            "  {:<8} {}   worst {:.1} ms",
            peer.name(),
            phases.join("   "),
            ms(worst)
        );
    }

    let (p50, p99, max) = deadline_overshoot(&url);
    println!(
        "\ndeadline precision (90 timed-out try_lock_for of 10-300 ms on a held lock): overshoot p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (targets: p99 <= 5, max <= 20)",
        ms(p50), ms(p99), ms(max)
    );

    println!("\nwaiting cost ({WAITERS} waiters in one process during a {HOLD:?} hold; redbaton max park {MAX_PARK:?}):");
    for peer in [Peer::Redbaton, Peer::Redlock] {
        let (per_waiter_second, cpu) = waiting_cost(peer, &url, &mut raw);
        println!(
            "  {:<8} {:>8.3} commands per waiter per second ({:.3} per waiter per max park)  CPU {:>6} ms",
            peer.name(), per_waiter_second, per_waiter_second * MAX_PARK.as_secs_f64(), cpu.as_millis()
        );
    }
}

/// Runs of one process of 16 threads, and of 2 and 4 processes of 8, on
/// one lock, each for redbaton and the `redlock` crate.
fn contended(url: &str, rtt: Duration) {
    let x = |d: Duration| d.as_secs_f64() / rtt.as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (label, processes) in [
        ("1 process x 16 threads", 1),
        ("2 processes x 8 threads", 2),
        ("4 processes x 8 threads", 4),
    ] {
        let pause = pause_between_holds()
            .map(|pause| format!(", {pause:?} between holds"))
            .unwrap_or_default();
        println!(
            "\ncontended, {label}, one lock, empty critical section{pause}, {CONTENDED_RUN:?}:"
        );
        let print = |name: &str, c: &Contended| {
            println!(
                "  {:<8} {:>8.0} acq/s  hand-off p50 {:>8.3} ms = {:>6.2} x RTT  p99 {:>8.3} ms  same thread again {:>5.1} %  longest wait {:>8.1} ms  overlaps {}",
                name, c.per_second, ms(c.handoff_p50), x(c.handoff_p50), ms(c.handoff_p99), c.same_again * 100.0, ms(c.longest_wait), c.overlaps
            );
        };
        let mut rates = Vec::new();
        for peer in [Peer::Redbaton, Peer::Fair, Peer::Redlock] {
            let c = if processes > 1 {
                contended_across_processes(peer, url, processes)
            } else {
                analyse(contend(peer, url, 16, CONTENDED_RUN, 0), CONTENDED_RUN)
            };
            print(peer.name(), &c);
            if let Some(p50) = c.across_p50 {
                println!(
                    "  {:<8} hand-offs between the processes only: p50 {:.3} ms = {:.2} x RTT",
                    peer.name(),
                    ms(p50),
                    x(p50)
                );
            }
            rates.push((c.per_second, c.handoff_p50));
        }
        let (plain, fair, redlock) = (rates[0], rates[1], rates[2]);
        println!(
            "  redbaton / redlock: {:.1} x the throughput, {:.1} x faster hand-off (p50)",
            plain.0 / redlock.0.max(1e-9),
            redlock.1.as_secs_f64() / plain.1.as_secs_f64().max(1e-9)
        );
        if processes == 1 {
            in_process_floors(url, plain, fair, &print);
        }
    }
}

/// The one-process run's floors (`turns.rs`): the same 16 threads taking
/// an in-memory first-come, first-served lock in turn, without and with a
/// `PING` per arrival, and redbaton's plain and fair lock (`plain`,
/// `fair`: acquisitions per second, hand-off p50) against them.
fn in_process_floors(
    url: &str,
    plain: (f64, Duration),
    fair: (f64, Duration),
    print: &dyn Fn(&str, &Contended),
) {
    let floor = |arrival_through_redis| {
        let holds = turns::contend(url, 16, CONTENDED_RUN, arrival_through_redis, now_ns);
        let events = holds
            .into_iter()
            .map(|(holder, asked, got, released)| Event {
                holder,
                asked,
                got,
                released,
            })
            .collect();
        analyse(events, CONTENDED_RUN)
    };
    let memory = floor(false);
    print("floor: turns in memory", &memory);
    let through_redis = floor(true);
    print("floor: turns, a PING per arrival", &through_redis);
    let vs = |(rate, p50): (f64, Duration), floor: &Contended| {
        format!(
            "{:.2} x its throughput, hand-off p50 {:.2} x its",
            rate / floor.per_second.max(1e-9),
            p50.as_secs_f64() / floor.handoff_p50.as_secs_f64().max(1e-9)
        )
    };
    println!("  redbaton / turns in memory: {}", vs(plain, &memory));
    println!(
        "  fair / turns, a PING per arrival: {}",
        vs(fair, &through_redis)
    );
}

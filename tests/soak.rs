//! The soak run: several processes × threads on a few lock names with
//! random holds, random deadlines and random crashes of a worker process.
//! Opt-in (about a minute):
//!
//! ```text
//! cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! `REDBATON_SOAK_SECS` changes the length (default 60).

mod support;

use std::env;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use support::JoinWithin;
use support::{child_role, spawn_child};
use testkit::{ChildProcess, RedisServer};

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const WORKERS: usize = 3;
const THREADS: usize = 4;
/// How far past its deadline a `try_lock_for` may return: one last attempt
/// after a baton, and scheduling on a loaded 2-core machine.
const OVERSHOOT_BOUND: Duration = Duration::from_millis(250);

/// A small xorshift generator: enough randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn seeded(salt: u64) -> Rng {
        let nanos = Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64;
        Rng((salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ nanos) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
#[ignore = "child-process entry point, started by the other tests of this file"]
fn child_entry() {
    let Some((role, url)) = child_role() else {
        return;
    };
    assert_eq!(role, "soak-worker");
    let seconds: u64 = env::var("REDBATON_SOAK_WORKER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let client = Client::builder(&url)
        .default_lease(Duration::from_secs(1))
        .max_park(Duration::from_millis(500))
        .build()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let (client, url) = (client.clone(), url.clone());
            thread::spawn(move || {
                let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut rng = Rng::seeded(t + 1);
                let (mut acquired, mut max_overshoot) = (0u64, Duration::ZERO);
                while Instant::now() < end {
                    let name = NAMES[rng.below(NAMES.len() as u64) as usize];
                    let lock = client.lock(name).unwrap();
                    let guard = if rng.below(3) == 0 {
                        lock.lock().unwrap()
                    } else {
                        let wait = Duration::from_millis(rng.below(200));
                        let start = Instant::now();
                        match lock.try_lock_for(wait).unwrap() {
                            Some(guard) => guard,
                            None => {
                                max_overshoot =
                                    max_overshoot.max(start.elapsed().saturating_sub(wait));
                                continue;
                            }
                        }
                    };
                    acquired += 1;
                    let marker = format!("soak:inside:{name}");
                    // The marker outlives any critical section here (<= 20 ms)
                    // but expires before the lease (1 s) of a holder killed
                    // inside it: its successor must not count that leftover.
                    let me = format!("{}:{}", std::process::id(), guard.fencing_token());
                    let alone: bool = redis::cmd("SET")
                        .arg(&marker)
                        .arg(&me)
                        .arg("NX")
                        .arg("PX")
                        .arg(900)
                        .query(&mut raw)
                        .unwrap();
                    if !alone {
                        let other: Option<String> =
                            redis::cmd("GET").arg(&marker).query(&mut raw).unwrap();
                        eprintln!("OVERLAP on {name}: {me} found {other:?} inside");
                        // Counted in Redis at once: a worker may be killed any time.
                        redis::cmd("INCR")
                            .arg("soak:overlaps")
                            .query::<()>(&mut raw)
                            .unwrap();
                    }
                    thread::sleep(Duration::from_millis(rng.below(20)));
                    if alone {
                        redis::cmd("DEL")
                            .arg(&marker)
                            .query::<()>(&mut raw)
                            .unwrap();
                    }
                    guard.unlock().unwrap();
                }
                (acquired, max_overshoot)
            })
        })
        .collect();
    let (mut acquired, mut overshoot) = (0, Duration::ZERO);
    for thread in threads {
        let (a, o) = thread.joined();
        acquired += a;
        overshoot = overshoot.max(o);
    }
    println!("RESULT {acquired} {}", overshoot.as_micros());
}

fn spawn_worker(server: &RedisServer, seconds: u64) -> ChildProcess {
    // SAFETY of the environment: set before spawning, read only by children.
    std::env::set_var("REDBATON_SOAK_WORKER_SECS", seconds.to_string());
    spawn_child("soak-worker", server)
}

#[test]
#[ignore = "soak run, about a minute: cargo test --release --test soak -- --ignored"]
fn soak_processes_threads_deadlines_and_crashes_never_overlap_or_leak() {
    let seconds: u64 = env::var("REDBATON_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let server = RedisServer::start();
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let mut rng = Rng::seeded(99);
    let mut workers: Vec<ChildProcess> = (0..WORKERS)
        .map(|_| spawn_worker(&server, seconds))
        .collect();
    let (mut crashes, mut acquired, mut overshoot) = (0, 0u64, Duration::ZERO);

    // Crash one worker every few seconds and start a replacement that runs
    // until the end.
    let crash = env::var("REDBATON_SOAK_CRASHES").map_or(true, |v| v != "0");
    while crash && Instant::now() + Duration::from_secs(6) < end {
        thread::sleep(Duration::from_secs(2 + rng.below(4)));
        let victim = rng.below(WORKERS as u64) as usize;
        workers[victim].kill();
        crashes += 1;
        let left = end
            .saturating_duration_since(Instant::now())
            .as_secs()
            .max(1);
        workers[victim] = spawn_worker(&server, left);
    }
    for worker in &mut workers {
        let lines =
            worker.lines_with_prefix_until_exit("RESULT", Duration::from_secs(seconds + 60));
        let numbers: Vec<u64> = lines[0].split(' ').map(|n| n.parse().unwrap()).collect();
        acquired += numbers[0];
        overshoot = overshoot.max(Duration::from_micros(numbers[1]));
    }

    let mut raw = server.connection();
    let overlaps: u64 = redis::cmd("GET")
        .arg("soak:overlaps")
        .query::<Option<u64>>(&mut raw)
        .unwrap()
        .unwrap_or(0);
    println!(
        "soak: {:?}, {WORKERS} processes x {THREADS} threads, {crashes} crashes, {acquired} acquisitions by surviving workers, {overlaps} overlaps, worst deadline overshoot {overshoot:?}",
        started.elapsed()
    );
    assert_eq!(overlaps, 0, "two holders were inside at once");
    assert!(crashes >= 1 || !crash);
    assert!(acquired > 0);
    assert!(
        overshoot <= OVERSHOOT_BOUND,
        "a waiter returned {overshoot:?} after its deadline"
    );

    // Leases (1 s) and batons (5 s) expire: only counters stay.
    let mut leftovers = Vec::new();
    support::eventually(
        Duration::from_secs(10),
        "locks and batons to expire",
        || {
            leftovers = redis::cmd("KEYS")
                .arg("redbaton:*")
                .query::<Vec<String>>(&mut raw)
                .unwrap();
            leftovers.iter().all(|k| {
                k.ends_with(":fence")
                    || k == "redbaton:identity"
                    || k.starts_with("redbaton:{redbaton:identity}:client:")
            })
        },
    );
    println!("keys left: {leftovers:?}");
}

//! Figures for issue 27: waiting at scale. One client's threads each wait
//! for a lock name of their own; another client holds every name and
//! releases them one by one, staggered over 3 s in a scrambled order. For
//! each N: the time from each release (just after `unlock()` returns) to
//! its waiter's acquisition (just after `lock()` returns), p50 / p99 /
//! max; the most connections the server had while the waiters waited
//! (both clients and the sampler's own); and what the waiters sent while
//! waiting (script calls, parks (`BLPOP`s and the parking hub's looks at a
//! name) and the sweeper's `EXISTS` per waiter per second, from `INFO
//! commandstats` over 4 s (twice the maximum park) once every waiter has
//! parked, before the first release).
//!
//! ```text
//! cargo bench --bench waiting                # N = 16, 256, 1024
//! cargo bench --bench waiting -- 16 10000    # other N
//! WAITING_MAX_PARK_SECS=30 cargo bench --bench waiting -- 10000
//! WAITING_SPREAD_SECS=10 cargo bench --bench waiting -- 10000
//! ```
//!
//! Needs `redis-server` on PATH. One private server per N.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

/// Over how long the releases are spread.
const SPREAD: Duration = Duration::from_secs(3);

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![16, 256, 1024]
    } else {
        sizes
    };
    for n in sizes {
        run(n);
    }
}

fn clients_now(admin: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
    list.lines().filter(|line| !line.trim().is_empty()).count()
}

/// The (client, key) pairs the server will announce a change of: the
/// names the waiting client's parking hub has registered.
fn tracked(admin: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("tracking_total_items:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn commandstats(admin: &mut redis::Connection) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
    testkit::parse_commandstats(&info)
}

fn run(names: usize) {
    let server = RedisServer::start();
    let mut admin = server.connection();
    // A long I/O timeout: at 10,000 names the waiters' first attempts
    // queue for the command pool (8 connections) longer than the default
    // 3 s on a small machine. Waiting itself does not use it.
    let io_timeout = Duration::from_secs(60);
    let holder = Client::builder(server.url())
        .io_timeout(io_timeout)
        .build()
        .unwrap();
    // WAITING_MAX_PARK_SECS: the waiting client's maximum park (default
    // 2 s, the client's default).
    let max_park = std::env::var("WAITING_MAX_PARK_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .map_or(Duration::from_secs(2), Duration::from_secs);
    let waiting = Client::builder(server.url())
        .io_timeout(io_timeout)
        .max_park(max_park)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..names).map(|n| format!("bench:wait:{n}")).collect();
    let guards: Vec<_> = keys
        .iter()
        .map(|name| holder.lock(name).unwrap().lock().unwrap())
        .collect();

    // Waiters start in batches of 256, each batch once the one before has
    // made its first attempts: thousands of threads asking the command
    // pool (8 connections) at once starve each other of the machine's
    // cores (each waiting checkout wakes every 20 ms) until the I/O
    // timeout passes.
    let (acquired, acquisitions) = mpsc::channel();
    let mut waiters = Vec::with_capacity(names);
    for batch in keys.chunks(256) {
        let ready = Arc::new(Barrier::new(batch.len() + 1));
        let first = waiters.len();
        for (offset, name) in batch.iter().enumerate() {
            let n = first + offset;
            let lock = waiting.lock(name).unwrap();
            let (ready, acquired) = (Arc::clone(&ready), acquired.clone());
            let started = thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    ready.wait();
                    let guard = lock.try_lock_for(Duration::from_secs(120)).unwrap();
                    let at = Instant::now();
                    assert!(guard.is_some(), "{n}: not acquired");
                    acquired.send((n, at)).unwrap();
                })
                .expect("a waiter thread");
            waiters.push(started);
        }
        ready.wait();
        thread::sleep(Duration::from_millis(300));
    }
    // Every waiter has made its first attempt and parked (its name
    // registered for an announcement); then 4 s of waiting (two maximum
    // parks) are counted.
    let parking = Instant::now();
    while tracked(&mut admin) < names as u64 {
        assert!(
            parking.elapsed() < Duration::from_secs(120),
            "{} of {names} names parked on after 120 s",
            tracked(&mut admin)
        );
        thread::sleep(Duration::from_millis(20));
    }
    let before = commandstats(&mut admin);
    let quiet = Instant::now();
    thread::sleep(Duration::from_secs(4));
    let after = commandstats(&mut admin);
    let quiet = quiet.elapsed().as_secs_f64();
    let sent = |command: &str| {
        after.get(command).copied().unwrap_or(0) - before.get(command).copied().unwrap_or(0)
    };
    let per_waiter_second = |calls: u64| calls as f64 / names as f64 / quiet;
    let scripts = per_waiter_second(sent("evalsha"));
    // A park in `BLPOP`, or a look at a waited name by the parking hub
    // (`LLEN`, then `LPOP`).
    let parks = per_waiter_second(sent("blpop") + sent("llen"));
    // The parking sweeper's checks of every waited lock key.
    let sweeps = per_waiter_second(sent("exists"));

    let peak = Arc::new(AtomicUsize::new(clients_now(&mut admin)));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        let port = server.port();
        thread::spawn(move || {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut admin = client.get_connection().unwrap();
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(clients_now(&mut admin), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // WAITING_SPREAD_SECS: over how long the releases are spread (default
    // 3 s), to tell the number of names waited on from the rate of
    // releases.
    let spread = std::env::var("WAITING_SPREAD_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .map_or(SPREAD, Duration::from_secs);
    let pause = spread / names as u32;
    let mut guards: Vec<_> = guards.into_iter().map(Some).collect();
    let mut released = vec![Instant::now(); names];
    let started = Instant::now();
    for (i, n) in scrambled(names).into_iter().enumerate() {
        guards[n].take().unwrap().unlock().unwrap();
        released[n] = Instant::now();
        // On schedule, whatever the releases cost.
        let next = started + pause * (i as u32 + 1);
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let mut wakes: Vec<Duration> = (0..names)
        .map(|_| {
            let (n, at) = acquisitions
                .recv_timeout(Duration::from_secs(120))
                .expect("every waiter gets its lock");
            at.saturating_duration_since(released[n])
        })
        .collect();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    for waiter in waiters {
        waiter.join().unwrap();
    }
    wakes.sort();
    let at = |q: f64| wakes[((wakes.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{names:>6} names: wake after release p50 {:.2} / p99 {:.2} / max {:.2} ms; \
         connections (both clients) {} at most; while waiting, per waiter per second: \
         {scripts:.3} script calls, {parks:.4} parks, {sweeps:.4} EXISTS",
        ms(at(0.5)),
        ms(at(0.99)),
        ms(wakes[wakes.len() - 1]),
        peak.load(Ordering::Relaxed).saturating_sub(2),
    );
}

/// A scrambled order of `0..n`: a fixed stride coprime with `n`.
fn scrambled(n: usize) -> Vec<usize> {
    let stride = (1..n.max(2))
        .map(|k| (n * 5 / 8 + k) | 1)
        .find(|s| gcd(*s, n) == 1)
        .unwrap_or(1);
    (0..n).map(|i| (i * stride + 7) % n).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

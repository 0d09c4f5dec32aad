//! Where an uncontended `lock` + `unlock` spends its time, against the
//! `SET NX PX` + compare-and-delete floor and the fenced floor (the same
//! Redis calls as redbaton's cycle, no other logic), on a private server: the wall
//! time and the client thread's CPU time per cycle, and what the server
//! spent per cycle (`INFO commandstats`: the scripts, and each Redis call
//! inside them with its own time).
//!
//!     cargo run --release --manifest-path benches/peers/Cargo.toml --example cycle_cost
//!
//! `CYCLE_COST=redbaton`, `=fenced` or `=floor` runs one side only (for
//! `strace -c`, or a server under `valgrind --tool=callgrind`);
//! `=semaphore` measures a semaphore's acquire + release of one permit
//! instead, `=read` a read-write lock's read + unlock.

use std::collections::HashMap;
use std::time::Instant;

#[path = "../cpu_time.rs"]
mod cpu_time;
#[path = "../floor.rs"]
mod floor;
use floor::{FencedFloorLock, FloorLock};

const CYCLES: u32 = 20_000;
const ROUNDS: usize = 3;

/// `INFO commandstats`: command → (calls, µs).
fn command_stats(conn: &mut redis::Connection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> Option<u64> {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .filter(|(name, _)| name != "info" && name != "config")
        .collect()
}

/// Runs `cycle` CYCLES times; prints the wall and CPU time per cycle and
/// the server's time per cycle, with each command's calls and µs per call.
/// `sent`: the commands the client sends (the others run inside them).
fn measure(label: &str, sent: &[&str], stats: &mut redis::Connection, mut cycle: impl FnMut()) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(stats)
        .expect("RESETSTAT");
    let (start, cpu) = (Instant::now(), cpu_time::thread());
    for _ in 0..CYCLES {
        cycle();
    }
    let wall = start.elapsed() / CYCLES;
    let cpu = (cpu_time::thread() - cpu) / CYCLES;
    let server = command_stats(stats);
    // A script's time includes the calls it makes: only the commands the
    // client sent count.
    let server_us: u64 = server
        .iter()
        .filter(|(name, _)| sent.contains(&name.as_str()))
        .map(|(_, (_, us))| us)
        .sum();
    let mut each: Vec<String> = server
        .iter()
        .filter(|(name, _)| !name.contains('|'))
        .map(|(name, (calls, us))| {
            format!(
                "{name} {:.1}/cycle {:.2} µs",
                *calls as f64 / f64::from(CYCLES),
                *us as f64 / (*calls).max(1) as f64
            )
        })
        .collect();
    each.sort();
    println!(
        "{label:<9} wall {:>6.1} µs  client thread CPU {:>5.1} µs  server {:>5.1} µs per cycle; {}",
        wall.as_secs_f64() * 1e6,
        cpu.as_secs_f64() * 1e6,
        server_us as f64 / f64::from(CYCLES),
        each.join(", ")
    );
}

fn main() {
    let redis = testkit::DemoRedis::from_env().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(1)
    });
    let url = redis.url.clone();
    let open = || {
        redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .expect("connect")
    };
    let (mut raw, mut stats) = (open(), open());
    let client = redbaton::Client::open(&url).expect("url");
    let lock = client.lock("bench:cycle-cost").expect("name");
    let floor = FloorLock::new("bench:cycle-cost:bare");
    let fenced = FencedFloorLock::new("bench:cycle-cost:fenced");
    let mut last_token = 0;
    // Warm up: scripts loaded, connections open, the thread's identity.
    for _ in 0..2_000 {
        lock.lock().expect("lock").unlock().expect("unlock");
    }
    let only = std::env::var("CYCLE_COST").unwrap_or_default();
    if only == "semaphore" || only == "read" {
        let semaphore = client.semaphore("bench:cycle-cost:sem").expect("name");
        semaphore.try_set_permits(4).expect("permits");
        let rw = client.rw_lock("bench:cycle-cost:rw").expect("name");
        for _ in 0..2_000 {
            drop(semaphore.acquire().expect("permit"));
            drop(rw.read().expect("read"));
        }
        for _ in 0..ROUNDS {
            if only == "semaphore" {
                measure("semaphore", &["evalsha"], &mut stats, || {
                    semaphore
                        .acquire()
                        .expect("permit")
                        .release()
                        .expect("release")
                });
            } else {
                measure("read", &["evalsha"], &mut stats, || {
                    rw.read().expect("read").unlock().expect("unlock")
                });
            }
        }
        return;
    }
    for _ in 0..ROUNDS {
        if only.is_empty() || only == "redbaton" {
            measure("redbaton", &["evalsha"], &mut stats, || {
                lock.lock().expect("lock").unlock().expect("unlock")
            });
        }
        if only.is_empty() || only == "fenced" {
            measure("fenced", &["evalsha"], &mut stats, || {
                let token = fenced.cycle(&mut raw);
                assert!(token > last_token, "the fenced floor's tokens increase");
                last_token = token;
            });
        }
        if only.is_empty() || only == "floor" {
            measure("floor", &["set", "evalsha"], &mut stats, || {
                floor.cycle(&mut raw)
            });
        }
    }
}

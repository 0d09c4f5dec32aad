//! The read-write lock demo: a two-field document in Redis (think of a
//! price list with a version on each half), read by many and rewritten
//! now and then, by several worker processes × threads.
//!
//! A writer sets the first field, works a little, then sets the second.
//! Without a lock, readers catch documents half written (the two fields
//! disagree). With redbaton's read-write lock around each read and write,
//! no reader ever does, and readers still read side by side.
//!
//! ```text
//! cargo run --example rw_lock
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::env;
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const PROCESSES: usize = 3;
const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 50;
/// One operation in this many is a write.
const WRITE_EVERY: usize = 5;
const FIRST: &str = "redbaton-demo:doc:first";
const SECOND: &str = "redbaton-demo:doc:second";
const INSIDE: &str = "redbaton-demo:doc:readers";
/// The work between a writer's two fields, and inside a read: the window in
/// which unlocked readers and writers collide.
const WORK: Duration = Duration::from_micros(500);

fn main() -> ExitCode {
    let args: Vec<String> = env::args().collect();
    if args.len() == 4 && args[1] == "--worker" {
        return worker(&args[2], &args[3]);
    }
    let redis = match testkit::DemoRedis::from_env() {
        Ok(redis) => redis,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    println!("redbaton read-write lock demo");
    println!(
        "  a two-field document, {PROCESSES} processes x {THREADS} threads, {OPS_PER_THREAD} operations each, 1 in {WRITE_EVERY} a write"
    );
    println!("  Redis: {}\n", redis.describe());

    let mut all_good = true;
    for (mode, label) in [("unlocked", "without a lock"), ("locked", "with redbaton")] {
        match run(&redis.url, mode) {
            Ok(outcome) => {
                let good = outcome.torn == 0;
                all_good &= mode == "unlocked" || good;
                println!(
                    "  {label:<15} {} reads ({:>3} torn), {} writes, up to {:>2} readers at once, {:>5.0} ms  {}",
                    outcome.reads,
                    outcome.torn,
                    outcome.writes,
                    outcome.most_readers,
                    outcome.elapsed.as_secs_f64() * 1000.0,
                    if good {
                        "every read saw a whole document"
                    } else {
                        "WRONG: readers saw half-written documents"
                    }
                );
            }
            Err(message) => {
                eprintln!("  {label}: {message}");
                return ExitCode::FAILURE;
            }
        }
    }
    if all_good {
        ExitCode::SUCCESS
    } else {
        println!("\n  the locked run went wrong: this is a bug in redbaton");
        ExitCode::FAILURE
    }
}

#[derive(Default)]
struct Outcome {
    reads: u64,
    torn: u64,
    writes: u64,
    most_readers: u64,
    elapsed: Duration,
}

/// Resets the document, runs the worker processes in `mode`, and adds up.
fn run(url: &str, mode: &str) -> Result<Outcome, String> {
    let mut redis = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .map_err(|err| format!("cannot reach Redis: {err}"))?;
    redis::cmd("MSET")
        .arg(&[FIRST, "0", SECOND, "0", INSIDE, "0"])
        .query::<()>(&mut redis)
        .map_err(|e| e.to_string())?;
    let exe = env::current_exe().map_err(|err| err.to_string())?;
    let started = Instant::now();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", mode, url])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start a worker process: {err}"))
        })
        .collect::<Result<_, _>>()?;
    let mut outcome = Outcome::default();
    for worker in workers {
        let output = worker.wait_with_output().map_err(|err| err.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("a worker failed ({}): {text}", output.status));
        }
        let numbers: Vec<u64> = text
            .split_whitespace()
            .map(|n| n.parse().map_err(|_| format!("odd worker output: {text}")))
            .collect::<Result<_, _>>()?;
        let [reads, torn, writes, most] = numbers[..] else {
            return Err(format!("odd worker output: {text}"));
        };
        outcome.reads += reads;
        outcome.torn += torn;
        outcome.writes += writes;
        outcome.most_readers = outcome.most_readers.max(most);
    }
    outcome.elapsed = started.elapsed();
    redis::cmd("DEL")
        .arg(&[FIRST, SECOND, INSIDE])
        .query::<()>(&mut redis)
        .map_err(|e| e.to_string())?;
    Ok(outcome)
}

/// One worker process: THREADS threads reading and writing the document;
/// prints its reads, torn reads, writes, and the most readers it saw
/// inside at once.
fn worker(mode: &str, url: &str) -> ExitCode {
    let client = match Client::builder(url).prefix("redbaton-demo").build() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let locked = mode == "locked";
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let client = client.clone();
            let url = url.to_owned();
            thread::spawn(move || -> Result<[u64; 4], String> {
                let lock = client.rw_lock("doc").map_err(|e| e.to_string())?;
                let mut redis = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(|e| e.to_string())?;
                let mut counts = [0u64; 4];
                for op in 0..OPS_PER_THREAD {
                    if (t + op) % WRITE_EVERY == 0 {
                        let guard = if locked {
                            Some(lock.write().map_err(|e| e.to_string())?)
                        } else {
                            None
                        };
                        write_document(&mut redis).map_err(|e| e.to_string())?;
                        counts[2] += 1;
                        if let Some(guard) = guard {
                            guard.unlock().map_err(|e| e.to_string())?;
                        }
                    } else {
                        let guard = if locked {
                            Some(lock.read().map_err(|e| e.to_string())?)
                        } else {
                            None
                        };
                        let (whole, inside) =
                            read_document(&mut redis).map_err(|e| e.to_string())?;
                        counts[0] += 1;
                        counts[1] += u64::from(!whole);
                        counts[3] = counts[3].max(inside);
                        if let Some(guard) = guard {
                            guard.unlock().map_err(|e| e.to_string())?;
                        }
                    }
                }
                Ok(counts)
            })
        })
        .collect();
    let mut totals = [0u64; 4];
    for thread in threads {
        match thread.join() {
            Ok(Ok(counts)) => {
                for i in 0..3 {
                    totals[i] += counts[i];
                }
                totals[3] = totals[3].max(counts[3]);
            }
            Ok(Err(err)) => {
                eprintln!("a thread failed: {err}");
                return ExitCode::FAILURE;
            }
            Err(_) => return ExitCode::FAILURE,
        }
    }
    println!("{} {} {} {}", totals[0], totals[1], totals[2], totals[3]);
    ExitCode::SUCCESS
}

/// Sets both fields to the next version, one after the other.
fn write_document(redis: &mut redis::Connection) -> redis::RedisResult<()> {
    let version: u64 = redis::cmd("INCR").arg(FIRST).query(redis)?;
    thread::sleep(WORK);
    redis::cmd("SET").arg(SECOND).arg(version).query(redis)
}

/// Reads both fields; whether they agree, and how many readers were inside.
fn read_document(redis: &mut redis::Connection) -> redis::RedisResult<(bool, u64)> {
    let inside: u64 = redis::cmd("INCR").arg(INSIDE).query(redis)?;
    let first: u64 = redis::cmd("GET").arg(FIRST).query(redis)?;
    thread::sleep(WORK);
    let second: u64 = redis::cmd("GET").arg(SECOND).query(redis)?;
    redis::cmd("DECR").arg(INSIDE).query::<()>(redis)?;
    Ok((first == second, inside))
}

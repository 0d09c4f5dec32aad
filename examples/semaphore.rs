//! Capping concurrency across processes: a pretend partner API takes at
//! most 3 calls at once. 3 processes × 4 threads call it; a bulk call
//! counts as 2. Without a limit, far more than 3 are in flight at once;
//! with a redbaton semaphore of 3 permits, never more than 3. Then a
//! process holding 2 permits is killed, and its permits come back when
//! their 1 s lease ends.
//!
//! ```text
//! cargo run --example semaphore
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::env;
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const PERMITS: u64 = 3;
const PROCESSES: usize = 3;
const THREADS: usize = 4;
const CALLS_PER_THREAD: usize = 8;
const PREFIX: &str = "redbaton-demo";
const IN_FLIGHT_KEY: &str = "redbaton-demo:in-flight";
const SEMAPHORE: &str = "partner-api:connections";
/// The lease of the process that is killed.
const LEASE: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let args: Vec<String> = env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--worker") if args.len() == 4 => return worker(&args[2], &args[3]),
        Some("--holder") if args.len() == 3 => return holder(&args[2]),
        _ => {}
    }
    // Keeps a throwaway server alive until the end of main.
    let redis = match testkit::DemoRedis::from_env() {
        Ok(redis) => redis,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    let (url, where_) = (redis.url.clone(), redis.describe());
    match run(&url, &where_) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("\n  the semaphore let too many in: this is a bug in redbaton");
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("  {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo; `Ok(false)` when the semaphore let more than its permits
/// in at once.
fn run(url: &str, where_: &str) -> Result<bool, String> {
    let client = Client::builder(url)
        .prefix(PREFIX)
        .build()
        .map_err(|e| e.to_string())?;
    let sem = client.semaphore(SEMAPHORE).map_err(|e| e.to_string())?;
    // Every process may call this at start-up: the first writer wins.
    let total = sem.try_set_permits(PERMITS).map_err(|e| e.to_string())?;

    println!("redbaton semaphore demo");
    println!(
        "  a partner API takes at most {PERMITS} calls at once; {PROCESSES} processes x {THREADS} threads \
         make {CALLS_PER_THREAD} calls each (every 4th a bulk call, worth 2)"
    );
    println!("  permits in Redis: {total}");
    println!("  Redis: {where_}\n");

    let mut good = true;
    for (mode, label) in [
        ("unlimited", "without a limit"),
        ("limited", "with redbaton"),
    ] {
        let (peak, calls, elapsed) = run_workers(url, mode)?;
        let verdict = if peak <= total {
            "never over the limit".to_owned()
        } else {
            format!("OVER the limit of {total}")
        };
        good &= mode == "unlimited" || peak <= total;
        println!(
            "  {label:<15} {calls} calls, at most {peak:>2} in flight at once, {:>5.0} ms  {verdict}",
            elapsed.as_secs_f64() * 1000.0
        );
    }

    // A holder that dies without releasing: its permits return when their
    // lease ends, and a waiter for all of them gets them then.
    let exe = env::current_exe().map_err(|e| e.to_string())?;
    let mut dying = Command::new(&exe)
        .args(["--holder", url])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the holder process: {e}"))?;
    let stdout = dying.stdout.take().ok_or("no stdout from the holder")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "HOLDING" {
        let _ = dying.kill();
        return Err(format!("odd holder output: {line:?}"));
    }
    let killed_at = Instant::now();
    dying.kill().map_err(|e| e.to_string())?;
    let _ = dying.wait();
    let all = sem
        .try_acquire_many_for(total, Duration::from_secs(10))
        .map_err(|e| e.to_string())?
        .ok_or("the killed holder's permits never came back")?;
    println!(
        "\n  a process holding 2 permits (lease {LEASE:?}) was killed; all {} were free again {:.0} ms later",
        all.num_permits(),
        killed_at.elapsed().as_secs_f64() * 1000.0
    );
    all.release().map_err(|e| e.to_string())?;
    Ok(good)
}

/// Runs the worker processes in `mode`; returns the most calls in flight
/// at once, the calls made and the time taken.
fn run_workers(url: &str, mode: &str) -> Result<(u64, usize, Duration), String> {
    let exe = env::current_exe().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", mode, url])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start a worker process: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut peak = 0;
    for worker in workers {
        let output = worker.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("a worker failed ({}): {text}", output.status));
        }
        let seen: u64 = text
            .trim()
            .parse()
            .map_err(|_| format!("odd worker output: {text}"))?;
        peak = peak.max(seen);
    }
    Ok((
        peak,
        PROCESSES * THREADS * CALLS_PER_THREAD,
        started.elapsed(),
    ))
}

/// One worker process: THREADS callers; prints the most calls it saw in
/// flight at once (counted in Redis, across processes).
fn worker(mode: &str, url: &str) -> ExitCode {
    let client = match Client::builder(url).prefix(PREFIX).build() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let limited = mode == "limited";
    let callers: Vec<_> = (0..THREADS)
        .map(|caller| {
            let (client, url) = (client.clone(), url.to_owned());
            thread::spawn(move || -> Result<u64, String> {
                let sem = client.semaphore(SEMAPHORE).map_err(|e| e.to_string())?;
                let mut redis = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(|e| e.to_string())?;
                let mut peak = 0;
                for call in 0..CALLS_PER_THREAD {
                    let weight = if (caller + call) % 4 == 0 { 2 } else { 1 };
                    let permit = if limited {
                        Some(sem.acquire_many(weight).map_err(|e| e.to_string())?)
                    } else {
                        None
                    };
                    let in_flight: u64 = redis::cmd("INCRBY")
                        .arg(IN_FLIGHT_KEY)
                        .arg(weight)
                        .query(&mut redis)
                        .map_err(|e| e.to_string())?;
                    peak = peak.max(in_flight);
                    call_partner_api(caller, call);
                    redis::cmd("DECRBY")
                        .arg(IN_FLIGHT_KEY)
                        .arg(weight)
                        .query::<()>(&mut redis)
                        .map_err(|e| e.to_string())?;
                    if let Some(permit) = permit {
                        permit.release().map_err(|e| e.to_string())?;
                    }
                }
                Ok(peak)
            })
        })
        .collect();
    let mut peak = 0;
    for caller in callers {
        match caller.join() {
            Ok(Ok(seen)) => peak = peak.max(seen),
            Ok(Err(err)) => {
                eprintln!("caller failed: {err}");
                return ExitCode::FAILURE;
            }
            Err(_) => return ExitCode::FAILURE,
        }
    }
    println!("{peak}");
    ExitCode::SUCCESS
}

/// Takes 2 permits with a 1 s lease, says so, and waits to be killed.
fn holder(url: &str) -> ExitCode {
    let held = Client::builder(url)
        .prefix(PREFIX)
        .default_lease(LEASE)
        .build()
        .and_then(|client| client.semaphore(SEMAPHORE))
        .and_then(|sem| sem.acquire_many(2));
    match held {
        Ok(permits) => {
            println!("HOLDING");
            thread::sleep(Duration::from_secs(60));
            drop(permits);
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

/// Stands in for a network call that takes 10 to 30 ms.
fn call_partner_api(caller: usize, call: usize) {
    thread::sleep(Duration::from_millis(
        10 + ((caller * 7 + call * 3) % 5) as u64 * 5,
    ));
}

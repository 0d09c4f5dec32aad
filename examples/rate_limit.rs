//! Pacing a pretend partner API: 8 threads, on two clients (as if two
//! processes), share one `Overall` budget of 20 calls per second, stored in
//! Redis. Prints the calls made in each second and the rate achieved.
//!
//! ```text
//! cargo run --example rate_limit
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, RateLimiter, RateMode};

const CLIENTS: usize = 2;
const THREADS_PER_CLIENT: usize = 4;
const PERMITS: u64 = 20;
const PER: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(5);
const LIMITER: &str = "partner-api";

fn main() -> ExitCode {
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
            println!("\n  the achieved rate is off: this is a bug in redbaton");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("  {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo; `Ok(false)` when the achieved rate is off.
fn run(url: &str, where_: &str) -> Result<bool, redbaton::Error> {
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|_| Client::builder(url).prefix("redbaton-demo").build())
        .collect::<Result<_, _>>()?;
    let limiter = clients[0].rate_limiter(LIMITER)?;
    // A demo starts from a clean slate; applications call set_rate at start-up
    // and let the first one win.
    limiter.delete()?;
    limiter.set_rate(RateMode::Overall, PERMITS, PER)?;
    let rate = limiter.rate()?;

    println!("redbaton rate limiter demo");
    println!("  {CLIENTS} clients x {THREADS_PER_CLIENT} threads call a pretend API for {RUN:?}");
    println!("  rate in Redis: {rate:?}");
    println!("  Redis: {where_}\n");

    let started = Instant::now();
    let end = started + RUN;
    let (calls, made) = mpsc::channel::<Duration>();
    let workers: Vec<_> = clients
        .iter()
        .flat_map(|client| (0..THREADS_PER_CLIENT).map(move |_| client.rate_limiter(LIMITER)))
        .enumerate()
        .map(|(caller, limiter)| {
            let calls = calls.clone();
            let limiter = limiter?;
            Ok(thread::spawn(move || {
                caller_loop(&limiter, caller, end, started, &calls)
            }))
        })
        .collect::<Result<_, redbaton::Error>>()?;
    drop(calls);
    for worker in workers {
        match worker.join() {
            Ok(result) => result?,
            Err(_) => eprintln!("  a caller thread panicked"),
        }
    }

    let mut per_second = vec![0u64; RUN.as_secs() as usize];
    for at in made.iter() {
        if let Some(count) = per_second.get_mut(at.as_secs() as usize) {
            *count += 1;
        }
    }
    for (second, count) in per_second.iter().enumerate() {
        let note = if second == 0 {
            format!("  (the full bucket of {PERMITS} goes out at once, then the rate)")
        } else {
            String::new()
        };
        println!(
            "  second {second}: {count:>3} calls {}{note}",
            "#".repeat(*count as usize)
        );
    }
    let total: u64 = per_second.iter().sum();
    let after_burst: u64 = per_second[1..].iter().sum();
    let steady = after_burst as f64 / (RUN.as_secs() - 1) as f64;
    let configured = PERMITS as f64 / PER.as_secs_f64();
    println!(
        "\n  {total} calls in {:.1} s; after the first second: {steady:.1} calls/s, configured {configured:.1}/s",
        RUN.as_secs_f64()
    );
    limiter.delete()?;
    Ok((steady - configured).abs() <= configured * 0.1
        && total <= PERMITS + PERMITS * RUN.as_secs())
}

/// One caller: takes a permit, calls the API, until `end`; reports the
/// time of each call since `started`.
fn caller_loop(
    limiter: &RateLimiter,
    caller: usize,
    end: Instant,
    started: Instant,
    calls: &mpsc::Sender<Duration>,
) -> Result<(), redbaton::Error> {
    let mut n = 0;
    while Instant::now() < end {
        if !limiter.try_acquire_until(1, end)? {
            break;
        }
        let at = started.elapsed();
        if at >= RUN {
            break;
        }
        call_partner_api(caller, n);
        let _ = calls.send(at);
        n += 1;
    }
    Ok(())
}

/// Stands in for a network call that takes 5 to 25 ms.
fn call_partner_api(caller: usize, n: usize) {
    thread::sleep(Duration::from_millis(
        5 + ((caller * 7 + n * 3) % 5) as u64 * 5,
    ));
}

//! The overselling demo: a stock of 200 items in Redis, sold one at a time
//! by several worker processes × threads with read-decrement-write.
//!
//! Without a lock, two sellers read the same stock and both sell the same
//! item (oversold) or overwrite each other (lost updates). With redbaton
//! around each sale, the stock ends at exactly 0 and every sale is counted.
//!
//! ```text
//! cargo run --example inventory
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::env;
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const STOCK: i64 = 200;
const PROCESSES: usize = 3;
const THREADS: usize = 4;
const STOCK_KEY: &str = "redbaton-demo:stock";
/// Stands in for the work between reading the stock and writing it back
/// (checking a payment, say): the window in which unlocked sellers collide.
const SALE_WORK: Duration = Duration::from_micros(300);

fn main() -> ExitCode {
    let args: Vec<String> = env::args().collect();
    if args.len() == 4 && args[1] == "--worker" {
        return worker(&args[2], &args[3]);
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

    println!("redbaton inventory demo");
    println!("  {STOCK} items, {PROCESSES} processes x {THREADS} threads, each selling one item at a time");
    println!("  Redis: {where_}\n");

    let mut all_good = true;
    for (mode, label) in [("unlocked", "without a lock"), ("locked", "with redbaton")] {
        match run(&url, mode) {
            Ok(outcome) => {
                let verdict = outcome.verdict();
                all_good &= mode == "unlocked" || verdict.is_none();
                println!(
                    "  {label:<15} sold {:>4}, stock ended at {:>4}, {:>6.0} ms  {}",
                    outcome.sold,
                    outcome.stock_left,
                    outcome.elapsed.as_secs_f64() * 1000.0,
                    verdict.unwrap_or_else(|| "every sale accounted for".to_owned()),
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

struct Outcome {
    sold: i64,
    stock_left: i64,
    elapsed: Duration,
}

impl Outcome {
    /// What went wrong, or `None` when the numbers add up.
    fn verdict(&self) -> Option<String> {
        let removed = STOCK - self.stock_left;
        if self.sold == STOCK && self.stock_left == 0 {
            None
        } else if self.sold > removed {
            Some(format!("WRONG: oversold by {}", self.sold - removed))
        } else {
            Some(format!(
                "WRONG: {} items vanished unsold",
                removed - self.sold
            ))
        }
    }
}

/// Resets the stock, runs the worker processes in `mode`, and adds up.
fn run(url: &str, mode: &str) -> Result<Outcome, String> {
    let mut redis = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .map_err(|err| format!("cannot reach Redis: {err}"))?;
    redis::cmd("SET")
        .arg(STOCK_KEY)
        .arg(STOCK)
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
    let mut sold = 0;
    for worker in workers {
        let output = worker.wait_with_output().map_err(|err| err.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("a worker failed ({}): {text}", output.status));
        }
        sold += text
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("odd worker output: {text}"))?;
    }
    let elapsed = started.elapsed();
    let stock_left: i64 = redis::cmd("GET")
        .arg(STOCK_KEY)
        .query(&mut redis)
        .map_err(|e| e.to_string())?;
    let _: () = redis::cmd("DEL")
        .arg(STOCK_KEY)
        .query(&mut redis)
        .map_err(|e| e.to_string())?;
    Ok(Outcome {
        sold,
        stock_left,
        elapsed,
    })
}

/// One worker process: THREADS sellers; prints how many items it sold.
fn worker(mode: &str, url: &str) -> ExitCode {
    let client = match Client::builder(url).prefix("redbaton-demo").build() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let locked = mode == "locked";
    let sellers: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = client.clone();
            let url = url.to_owned();
            thread::spawn(move || -> Result<i64, String> {
                let lock = client.lock("inventory:stock").map_err(|e| e.to_string())?;
                let mut redis = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(|e| e.to_string())?;
                let mut sold = 0;
                loop {
                    let guard = if locked {
                        Some(lock.lock().map_err(|e| e.to_string())?)
                    } else {
                        None
                    };
                    let stock: i64 = redis::cmd("GET")
                        .arg(STOCK_KEY)
                        .query(&mut redis)
                        .map_err(|e| e.to_string())?;
                    if stock <= 0 {
                        return Ok(sold);
                    }
                    thread::sleep(SALE_WORK);
                    redis::cmd("SET")
                        .arg(STOCK_KEY)
                        .arg(stock - 1)
                        .query::<()>(&mut redis)
                        .map_err(|e| e.to_string())?;
                    sold += 1;
                    if let Some(guard) = guard {
                        guard.unlock().map_err(|e| e.to_string())?;
                    }
                }
            })
        })
        .collect();
    let mut sold = 0;
    for seller in sellers {
        match seller.join() {
            Ok(Ok(n)) => sold += n,
            Ok(Err(err)) => {
                eprintln!("seller failed: {err}");
                return ExitCode::FAILURE;
            }
            Err(_) => return ExitCode::FAILURE,
        }
    }
    println!("{sold}");
    ExitCode::SUCCESS
}

//! The overselling demo of `inventory.rs`, with the sale written as a
//! `#[redbaton::locked]` function instead of taking a guard by hand.
//!
//! A stock of 200 items in Redis is sold one at a time by several worker
//! processes × threads, each sale a read-decrement-write. `sell_one` holds
//! the lock `inventory:<item>` for its whole body, so the stock ends at
//! exactly 0 and every sale is counted (`inventory.rs` shows what happens
//! without the lock).
//!
//! ```text
//! cargo run --example inventory_locked --features macros
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::env;
use std::fmt;
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const STOCK: i64 = 200;
const PROCESSES: usize = 3;
const THREADS: usize = 4;
const ITEM: &str = "widget";
/// Stands in for the work between reading the stock and writing it back
/// (checking a payment, say): the window in which unlocked sellers collide.
const SALE_WORK: Duration = Duration::from_micros(300);

/// Why a sale failed: the lock (busy for 30 s, or Redis unreachable), or
/// the stock's own Redis commands.
#[derive(Debug)]
enum SaleError {
    Lock(redbaton::Error),
    Stock(redis::RedisError),
}

impl From<redbaton::Error> for SaleError {
    fn from(error: redbaton::Error) -> Self {
        SaleError::Lock(error)
    }
}

impl From<redis::RedisError> for SaleError {
    fn from(error: redis::RedisError) -> Self {
        SaleError::Stock(error)
    }
}

impl fmt::Display for SaleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaleError::Lock(error) => write!(f, "lock: {error}"),
            SaleError::Stock(error) => write!(f, "stock: {error}"),
        }
    }
}

fn stock_key(item: &str) -> String {
    format!("redbaton-demo:stock:{item}")
}

/// Sells one `item` if any is left, and says whether it did. The whole
/// body holds the lock `inventory:<item>`, waiting up to 30 s for it; the
/// early `return` and the `?`s release it like the last line does.
#[redbaton::locked(client = client, key = "inventory:{item}", wait = "30s")]
fn sell_one(client: &Client, stock: &mut redis::Connection, item: &str) -> Result<bool, SaleError> {
    let left: i64 = redis::cmd("GET").arg(stock_key(item)).query(stock)?;
    if left <= 0 {
        return Ok(false);
    }
    thread::sleep(SALE_WORK);
    redis::cmd("SET")
        .arg(stock_key(item))
        .arg(left - 1)
        .query::<()>(stock)?;
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().collect();
    if args.len() == 3 && args[1] == "--worker" {
        return worker(&args[2]);
    }

    // Keeps a throwaway server alive until the end of main.
    let redis = match testkit::DemoRedis::from_env() {
        Ok(redis) => redis,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    println!("redbaton inventory demo, the sale as a #[redbaton::locked] function");
    println!("  {STOCK} items, {PROCESSES} processes x {THREADS} threads, each selling one item at a time");
    println!("  Redis: {}\n", redis.describe());

    match run(&redis.url) {
        Ok((sold, left, elapsed)) => {
            let good = sold == STOCK && left == 0;
            println!(
                "  sold {sold:>4}, stock ended at {left:>4}, {:>6.0} ms  {}",
                elapsed.as_secs_f64() * 1000.0,
                if good {
                    "every sale accounted for"
                } else {
                    "WRONG: this is a bug in redbaton"
                }
            );
            if good {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("  {message}");
            ExitCode::FAILURE
        }
    }
}

/// Sets the stock, runs the worker processes, and adds up: (sold, left,
/// time taken).
fn run(url: &str) -> Result<(i64, i64, Duration), String> {
    let mut redis = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .map_err(|err| format!("cannot reach Redis: {err}"))?;
    redis::cmd("SET")
        .arg(stock_key(ITEM))
        .arg(STOCK)
        .query::<()>(&mut redis)
        .map_err(|e| e.to_string())?;

    let exe = env::current_exe().map_err(|err| err.to_string())?;
    let started = Instant::now();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", url])
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
    let left: i64 = redis::cmd("GET")
        .arg(stock_key(ITEM))
        .query(&mut redis)
        .map_err(|e| e.to_string())?;
    redis::cmd("DEL")
        .arg(stock_key(ITEM))
        .query::<()>(&mut redis)
        .map_err(|e| e.to_string())?;
    Ok((sold, left, elapsed))
}

/// One worker process: THREADS sellers; prints how many items it sold.
fn worker(url: &str) -> ExitCode {
    let client = match Client::builder(url).prefix("redbaton-demo").build() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let sellers: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = client.clone();
            let url = url.to_owned();
            thread::spawn(move || -> Result<i64, SaleError> {
                let mut stock = redis::Client::open(url)?.get_connection()?;
                let mut sold = 0;
                while sell_one(&client, &mut stock, ITEM)? {
                    sold += 1;
                }
                Ok(sold)
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

//! The transfer demo: five accounts in Redis, and money moved between random
//! pairs of them by several worker processes × threads, each transfer a
//! read of both balances and a write of both.
//!
//! Without a lock, two transfers that touch one account overwrite each
//! other: money appears or vanishes, and the total drifts. Locking each
//! account on its own invites deadlock (one thread holds `a` and waits for
//! `b`, another holds `b` and waits for `a`). With a redbaton multi-lock on
//! the pair, taken all or none, every transfer lands and the total is
//! exact.
//!
//! ```text
//! cargo run --example transfer
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::env;
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const ACCOUNTS: u64 = 5;
const OPENING_BALANCE: i64 = 1_000;
const PROCESSES: usize = 3;
const THREADS: usize = 4;
const TRANSFERS_PER_THREAD: usize = 40;
const KEY_PREFIX: &str = "redbaton-demo:balance";
/// Stands in for the work between reading the balances and writing them
/// back (a fraud check, say): the window in which unlocked transfers
/// collide.
const TRANSFER_WORK: Duration = Duration::from_micros(300);

fn main() -> ExitCode {
    let args: Vec<String> = env::args().collect();
    if args.len() == 5 && args[1] == "--worker" {
        return worker(&args[2], &args[3], &args[4]);
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
    let total = OPENING_BALANCE * ACCOUNTS as i64;

    println!("redbaton transfer demo");
    println!(
        "  {ACCOUNTS} accounts of {OPENING_BALANCE}, {PROCESSES} processes x {THREADS} threads, {TRANSFERS_PER_THREAD} transfers each between random pairs"
    );
    println!("  Redis: {where_}\n");

    let mut all_good = true;
    for (mode, label) in [
        ("unlocked", "without a lock"),
        ("locked", "with a multi-lock"),
    ] {
        match run(&url, mode) {
            Ok((balances, elapsed)) => {
                let sum: i64 = balances.iter().sum();
                let verdict = if sum == total && balances.iter().all(|b| *b >= 0) {
                    "every transfer accounted for".to_owned()
                } else {
                    format!("WRONG: the total is {sum}, not {total}")
                };
                all_good &= mode == "unlocked" || sum == total;
                println!(
                    "  {label:<17} balances {balances:?}, total {sum:>5}, {:>6.0} ms  {verdict}",
                    elapsed.as_secs_f64() * 1000.0,
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

fn balance_key(account: u64) -> String {
    format!("{KEY_PREFIX}:{account}")
}

/// Opens the accounts, runs the worker processes in `mode`, and reads the
/// balances back.
fn run(url: &str, mode: &str) -> Result<(Vec<i64>, Duration), String> {
    let mut redis = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .map_err(|err| format!("cannot reach Redis: {err}"))?;
    for account in 0..ACCOUNTS {
        redis::cmd("SET")
            .arg(balance_key(account))
            .arg(OPENING_BALANCE)
            .query::<()>(&mut redis)
            .map_err(|e| e.to_string())?;
    }

    let exe = env::current_exe().map_err(|err| err.to_string())?;
    let started = Instant::now();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|index| {
            Command::new(&exe)
                .args(["--worker", mode, url, &index.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start a worker process: {err}"))
        })
        .collect::<Result<_, _>>()?;
    for worker in workers {
        let output = worker.wait_with_output().map_err(|err| err.to_string())?;
        if !output.status.success() {
            let text = String::from_utf8_lossy(&output.stdout);
            return Err(format!("a worker failed ({}): {text}", output.status));
        }
    }
    let elapsed = started.elapsed();
    let mut balances = Vec::new();
    for account in 0..ACCOUNTS {
        let key = balance_key(account);
        balances.push(
            redis::cmd("GET")
                .arg(&key)
                .query::<i64>(&mut redis)
                .map_err(|e| e.to_string())?,
        );
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query(&mut redis)
            .map_err(|e| e.to_string())?;
    }
    Ok((balances, elapsed))
}

/// A small xorshift generator: the demo needs no better randomness than
/// this, nor a dependency for it.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// One worker process: THREADS threads each make their transfers.
fn worker(mode: &str, url: &str, index: &str) -> ExitCode {
    let client = match Client::builder(url).prefix("redbaton-demo").build() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let locked = mode == "locked";
    let seed = index.parse::<u64>().unwrap_or(0) * 1_000 + 1;
    let tellers: Vec<_> = (0..THREADS as u64)
        .map(|thread_index| {
            let client = client.clone();
            let url = url.to_owned();
            thread::spawn(move || -> Result<(), String> {
                let mut redis = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(|e| e.to_string())?;
                let mut dice = Dice(0x9E37_79B9_7F4A_7C15 ^ (seed + thread_index));
                for _ in 0..TRANSFERS_PER_THREAD {
                    let from = dice.roll(ACCOUNTS);
                    let to = (from + 1 + dice.roll(ACCOUNTS - 1)) % ACCOUNTS;
                    let amount = 1 + dice.roll(50) as i64;
                    let (from_key, to_key) = (balance_key(from), balance_key(to));
                    // Both accounts or neither; the order given does not
                    // matter, so two opposite transfers cannot deadlock.
                    let guard = if locked {
                        let pair = client
                            .multi_lock([format!("account:{from}"), format!("account:{to}")])
                            .map_err(|e| e.to_string())?;
                        Some(pair.lock().map_err(|e| e.to_string())?)
                    } else {
                        None
                    };
                    let (from_balance, to_balance): (i64, i64) = redis::cmd("MGET")
                        .arg(&from_key)
                        .arg(&to_key)
                        .query(&mut redis)
                        .map_err(|e| e.to_string())?;
                    thread::sleep(TRANSFER_WORK);
                    if from_balance >= amount {
                        redis::cmd("MSET")
                            .arg(&from_key)
                            .arg(from_balance - amount)
                            .arg(&to_key)
                            .arg(to_balance + amount)
                            .query::<()>(&mut redis)
                            .map_err(|e| e.to_string())?;
                    }
                    if let Some(guard) = guard {
                        guard.unlock().map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            })
        })
        .collect();
    for teller in tellers {
        match teller.join() {
            Ok(Ok(())) => {}
            Ok(Err(message)) => {
                println!("{message}");
                return ExitCode::FAILURE;
            }
            Err(_) => {
                println!("a transfer thread panicked");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

//! Uncontended cost of a lock, as a ratio to the Redis round trip measured in
//! the same run.
//!
//! ```text
//! cargo bench --bench roundtrip
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise a throwaway `redis-server` from PATH.
//! Absolute figures are noisy; the ratios are what to compare.

use std::env;
use std::time::{Duration, Instant};

use redbaton::LockClient;

const ROUNDS: usize = 5_000;
const WARMUP: usize = 500;

fn main() {
    let (url, _server) = match env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = testkit::RedisServer::try_start().unwrap_or_else(|message| {
                eprintln!("{message}");
                std::process::exit(1)
            });
            (server.url(), Some(server))
        }
    };
    let mut raw = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to Redis");
    let client = LockClient::open(&url).expect("valid URL");
    let lock = client.lock("bench:uncontended").expect("valid name");

    let ping = median(|| {
        redis::cmd("PING").query::<String>(&mut raw).expect("PING");
    });
    let cycle = median(|| {
        lock.lock().expect("lock").unlock().expect("unlock");
    });
    let held = lock.lock().expect("lock");
    let reentry = median(|| {
        lock.lock().expect("re-enter").unlock().expect("unlock");
    });
    drop(held);

    println!("redbaton uncontended, median of {ROUNDS} after {WARMUP} warm-up rounds");
    println!("  PING round trip (RTT)        {:>8.1} µs", micros(ping));
    report("lock + unlock cycle", cycle, ping);
    report("re-entry lock + unlock", reentry, ping);
}

fn report(what: &str, took: Duration, rtt: Duration) {
    println!(
        "  {what:<28} {:>8.1} µs  = {:.2} x RTT",
        micros(took),
        took.as_secs_f64() / rtt.as_secs_f64()
    );
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The median time of one call of `f` over `ROUNDS` calls.
fn median(mut f: impl FnMut()) -> Duration {
    for _ in 0..WARMUP {
        f();
    }
    let mut times: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[ROUNDS / 2]
}

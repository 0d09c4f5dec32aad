//! Figures for issue 26: what an uncontended multi-lock costs next to one
//! lock, on a throwaway local `redis-server`.
//!
//! The median cycle (`lock()` then `unlock()`) of a `MultiLock` of two
//! names and of three, against the median cycle of one `Lock`, measured
//! in the same run with the cycles interleaved so that the machine's
//! noise falls on all of them alike (target: two names within 1.2 × one
//! lock: one round trip each way for both).
//!
//! ```text
//! cargo bench --bench multi_lock
//! ```
//!
//! Needs `redis-server` on PATH. Absolute times are noisy on a shared
//! machine; the ratios are what to compare.

use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

/// Cycles run and thrown away before any timing.
const WARM_UP: usize = 300;
/// Timed cycles of each kind.
const ROUNDS: usize = 3_000;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn timed(cycle: impl FnOnce()) -> Duration {
    let start = Instant::now();
    cycle();
    start.elapsed()
}

fn main() {
    let server = RedisServer::start();
    let client = Client::open(server.url().as_str()).expect("a client of the local server");
    let one = client.lock("bench:multi:one").unwrap();
    let two = client
        .multi_lock(["bench:multi:a", "bench:multi:b"])
        .unwrap();
    let three = client
        .multi_lock(["bench:multi:c", "bench:multi:d", "bench:multi:e"])
        .unwrap();
    for _ in 0..WARM_UP {
        one.lock().unwrap().unlock().unwrap();
        two.lock().unwrap().unlock().unwrap();
        three.lock().unwrap().unlock().unwrap();
    }
    let (mut ones, mut twos, mut threes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ones.push(timed(|| one.lock().unwrap().unlock().unwrap()));
        twos.push(timed(|| two.lock().unwrap().unlock().unwrap()));
        threes.push(timed(|| three.lock().unwrap().unlock().unwrap()));
    }
    let (one, two, three) = (median(ones), median(twos), median(threes));
    let ratio = |d: Duration| d.as_secs_f64() / one.as_secs_f64();
    println!("uncontended cycle, median of {ROUNDS} (one server on loopback):");
    println!("  Lock            {one:>10.1?}");
    println!(
        "  MultiLock of 2  {two:>10.1?}  {:.2} x one lock (target <= 1.2)",
        ratio(two)
    );
    println!(
        "  MultiLock of 3  {three:>10.1?}  {:.2} x one lock",
        ratio(three)
    );
}

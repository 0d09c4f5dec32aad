//! The count-down latch: a coordinator waits until four workers (each its
//! own client, as if on other machines) have warmed up, and three watchers
//! wait for the same moment; all are released together, none early.
//!
//! ```text
//! cargo run --example latch
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const WORKERS: u64 = 4;
const WATCHERS: usize = 3;

fn main() -> ExitCode {
    testkit::DemoRedis::run_demo("redbaton count-down latch demo", run)
}

fn run(url: &str) -> Result<bool, redbaton::Error> {
    let coordinator = Client::open(url)?;
    let ready = coordinator.count_down_latch("demo:warmed-up")?;
    ready.try_set_count(WORKERS)?;
    let started = Instant::now();

    let watchers: Vec<_> = (0..WATCHERS)
        .map(|who| {
            let client = Client::open(url)?;
            Ok(thread::spawn(
                move || -> Result<Duration, redbaton::Error> {
                    client.count_down_latch("demo:warmed-up")?.wait()?;
                    let at = started.elapsed();
                    println!("  watcher {who} released at {:>4} ms", at.as_millis());
                    Ok(at)
                },
            ))
        })
        .collect::<Result<_, redbaton::Error>>()?;
    let workers: Vec<_> = (0..WORKERS)
        .map(|who| {
            let client = Client::open(url)?;
            Ok(thread::spawn(
                move || -> Result<Duration, redbaton::Error> {
                    thread::sleep(Duration::from_millis(100 * (who + 1)));
                    let left = client.count_down_latch("demo:warmed-up")?.count_down()?;
                    let at = started.elapsed();
                    println!(
                        "  worker {who} warmed up at {:>4} ms, {left} to go",
                        at.as_millis()
                    );
                    Ok(at)
                },
            ))
        })
        .collect::<Result<_, redbaton::Error>>()?;

    ready.wait_for(Duration::from_secs(30))?;
    println!(
        "  coordinator released at {:>4} ms",
        started.elapsed().as_millis()
    );
    let mut last_count_down = Duration::ZERO;
    for worker in workers {
        last_count_down = last_count_down.max(worker.join().expect("a demo thread panicked")?);
    }
    let mut all_after = true;
    for watcher in watchers {
        // A watcher's clock reading comes after its release, which comes
        // after the last count-down's reply was sent by Redis: it may read
        // a hair before the worker's own reading of that reply.
        let at = watcher.join().expect("a demo thread panicked")?;
        all_after &= at + Duration::from_millis(5) >= last_count_down;
    }
    println!(
        "  every watcher released after the last count-down: {}",
        if all_after { "yes" } else { "NO" }
    );
    Ok(all_after)
}

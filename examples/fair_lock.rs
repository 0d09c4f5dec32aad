//! The fair lock: six clients (think six processes) ask for one lock while
//! it is held, 20 ms apart; each is served in the order it asked, woken by
//! a release that wakes exactly it.
//!
//! ```text
//! cargo run --example fair_lock
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;

const CLIENTS: usize = 6;

fn main() -> ExitCode {
    testkit::DemoRedis::run_demo("redbaton fair lock demo", run)
}

fn run(url: &str) -> Result<bool, redbaton::Error> {
    let holder = Client::open(url)?;
    let turnstile = holder.fair_lock("demo:turnstile")?;
    let held = turnstile.lock()?;
    let started = Instant::now();
    let (served, order) = mpsc::channel();
    let mut waiters = Vec::new();
    for who in 0..CLIENTS {
        let client = Client::open(url)?;
        let served = served.clone();
        waiters.push(thread::spawn(move || -> Result<(), redbaton::Error> {
            let lock = client.fair_lock("demo:turnstile")?;
            let guard = lock.lock()?;
            println!(
                "  client {who} served at {:>4} ms, token {}",
                started.elapsed().as_millis(),
                guard.fencing_token()
            );
            let _ = served.send(who);
            thread::sleep(Duration::from_millis(10));
            guard.unlock()
        }));
        // The clients ask in order, 20 ms apart.
        thread::sleep(Duration::from_millis(20));
    }
    println!("  {CLIENTS} clients asked, 20 ms apart; releasing");
    held.unlock()?;
    let mut order_seen = Vec::new();
    for _ in 0..CLIENTS {
        match order.recv_timeout(Duration::from_secs(30)) {
            Ok(who) => order_seen.push(who),
            Err(_) => break,
        }
    }
    for waiter in waiters {
        waiter.join().expect("a demo thread panicked")?;
    }
    let in_order = order_seen == (0..CLIENTS).collect::<Vec<_>>();
    println!(
        "  served in arrival order: {}",
        if in_order { "yes" } else { "NO" }
    );
    Ok(in_order)
}

//! Watching a client: three clients (think three processes) contend for one
//! lock with an event hook and metrics on; then a holder learns of a lost
//! lock from its loss signal; then the metrics are printed as a scrape
//! would see them.
//!
//! ```text
//! cargo run --example observe --features metrics
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redbaton::{Client, Event};

const CLIENTS: usize = 3;
const THREADS: usize = 4;
const ROUNDS: usize = 10;

fn main() -> ExitCode {
    testkit::DemoRedis::run_demo("redbaton observe demo", run)
}

fn run(url: &str) -> Result<bool, redbaton::Error> {
    // The application's recorder; an exporter (Prometheus, StatsD, ...)
    // would be installed here instead.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        eprintln!("  a metrics recorder was already installed");
        return Ok(false);
    }

    // Print the first few events of each kind, as a log would show them.
    let printed = Arc::new(AtomicUsize::new(0));
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|index| {
            let printed = Arc::clone(&printed);
            Client::builder(url)
                .client_name(&format!("observe-demo-{index}"))
                .metrics(false)
                .on_event(move |event| print_some(index, event, &printed))
                .build()
        })
        .collect::<Result<_, _>>()?;

    println!("  {CLIENTS} clients x {THREADS} threads x {ROUNDS} rounds on one lock:");
    let mut workers = Vec::new();
    for client in &clients {
        for _ in 0..THREADS {
            let lock = client.lock("demo:observed")?;
            workers.push(thread::spawn(move || -> Result<(), redbaton::Error> {
                for _ in 0..ROUNDS {
                    lock.with_lock(|| thread::sleep(Duration::from_millis(2)))?;
                }
                Ok(())
            }));
        }
    }
    for worker in workers {
        worker.join().expect("a demo thread panicked")?;
    }

    // A holder with a 300 ms fixed lease that overstays it: its loss
    // signal fires at the lease's end, without any polling.
    let short = clients[0]
        .lock("demo:short")?
        .with_fixed_lease(Duration::from_millis(300))?;
    let guard = short.lock()?;
    let lost = guard.lost();
    match lost.recv_timeout(Duration::from_secs(5)) {
        Ok(reason) => println!("  the short lease's holder was told: {reason}"),
        Err(_) => println!("  the short lease's holder was never told"),
    }
    drop(guard);

    println!("  metrics, as a scrape would see them:");
    let mut acquisitions = 0;
    let mut held = 0.0;
    let mut lines = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}=\"{}\"", label.key(), label.value()))
            .collect();
        let id = format!("{}{{{}}}", key.name(), labels.join(","));
        let shown = match value {
            DebugValue::Counter(n) => {
                if key.name() == "redbaton_acquisitions_total" {
                    acquisitions += n;
                }
                n.to_string()
            }
            DebugValue::Gauge(g) => {
                if key.name() == "redbaton_held" {
                    held += g.into_inner();
                }
                g.into_inner().to_string()
            }
            DebugValue::Histogram(samples) => {
                let mut samples: Vec<f64> = samples.iter().map(|s| s.into_inner()).collect();
                samples.sort_by(f64::total_cmp);
                let p50 = samples.get(samples.len() / 2).copied().unwrap_or(0.0);
                let max = samples.last().copied().unwrap_or(0.0);
                format!(
                    "{} samples, p50 {:.1} ms, max {:.1} ms",
                    samples.len(),
                    p50 * 1e3,
                    max * 1e3
                )
            }
        };
        lines.push(format!("    {id} {shown}"));
    }
    lines.sort();
    for line in &lines {
        println!("{line}");
    }
    // Every acquisition was counted (the contended ones and the short
    // one), and every hold ended once (released, or lost): none held now.
    let expected = (CLIENTS * THREADS * ROUNDS + 1) as u64;
    let counted = acquisitions == expected && held == 0.0;
    println!(
        "  acquisitions counted: {acquisitions} of {expected}, held now: {held}: {}",
        if counted { "yes" } else { "NO" }
    );
    Ok(counted)
}

/// Prints the first events a log would show, then only losses.
fn print_some(client: usize, event: &Event<'_>, printed: &AtomicUsize) {
    let first = printed.fetch_add(1, Ordering::Relaxed) < 8;
    match event {
        Event::Lost { name, reason, .. } => {
            println!("    client {client}: lost {name}: {reason}");
        }
        Event::Acquired {
            name, waited, how, ..
        } if first => {
            println!("    client {client}: acquired {name} ({how:?}, waited {waited:?})");
        }
        Event::Parked { name, .. } if first => println!("    client {client}: parked on {name}"),
        _ => {}
    }
}

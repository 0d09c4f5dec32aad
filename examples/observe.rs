//! Watching a client: three processes contend for one lock, each with an
//! event hook and metrics on; one of them then learns of a lost lock from
//! its loss signal; each prints its metrics as a scrape would see them.
//!
//! ```text
//! cargo run --example observe --features metrics
//! ```
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port.

use std::env;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redbaton::{Client, Event};

const PROCESSES: usize = 3;
const THREADS: usize = 4;
const ROUNDS: usize = 10;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().collect();
    if args.len() == 4 && args[1] == "--worker" {
        return match worker(&args[2], &args[3]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        };
    }
    testkit::DemoRedis::run_demo("redbaton observe demo", run)
}

/// Starts the worker processes and adds up what their metrics counted.
fn run(url: &str) -> Result<bool, String> {
    println!("  {PROCESSES} processes x {THREADS} threads x {ROUNDS} rounds on one lock:");
    let exe = env::current_exe().map_err(|err| err.to_string())?;
    let workers: Vec<_> = (0..PROCESSES)
        .map(|index| {
            Command::new(&exe)
                .args(["--worker", &index.to_string(), url])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start a worker process: {err}"))
        })
        .collect::<Result<_, _>>()?;
    let (mut acquisitions, mut held) = (0, 0.0);
    for worker in workers {
        let output = worker.wait_with_output().map_err(|err| err.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("a worker failed ({}): {text}", output.status));
        }
        for line in text.lines() {
            match line.strip_prefix("TOTAL ") {
                Some(total) => {
                    let (a, h) = total
                        .split_once(' ')
                        .ok_or_else(|| format!("odd worker output: {line}"))?;
                    acquisitions += a.parse::<u64>().map_err(|e| e.to_string())?;
                    held += h.parse::<f64>().map_err(|e| e.to_string())?;
                }
                None => println!("{line}"),
            }
        }
    }
    // Every acquisition was counted (the contended ones and the short
    // one), and every hold ended once (released, or lost): none held now.
    let expected = (PROCESSES * THREADS * ROUNDS + 1) as u64;
    let counted = acquisitions == expected && held == 0.0;
    println!(
        "  acquisitions counted by the {PROCESSES} processes: {acquisitions} of {expected}, held now: {held}: {}",
        if counted { "yes" } else { "NO" }
    );
    Ok(counted)
}

/// One process: contends with the hook and metrics on, then prints its
/// metrics and a `TOTAL <acquisitions> <held>` line for the parent.
fn worker(index: &str, url: &str) -> Result<(), String> {
    let index: usize = index.parse().map_err(|_| format!("odd index {index}"))?;
    // The application's recorder; an exporter (Prometheus, StatsD, ...)
    // would be installed here instead.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .map_err(|_| "a metrics recorder was already installed".to_owned())?;

    // Prints the first few events, as a log would show them.
    let printed = Arc::new(AtomicUsize::new(0));
    let client = Client::builder(url)
        .client_name(&format!("observe-demo-{index}"))
        .metrics(false)
        .on_event({
            let printed = Arc::clone(&printed);
            move |event| print_some(index, event, &printed)
        })
        .build()
        .map_err(|err| err.to_string())?;

    let mut threads = Vec::new();
    for _ in 0..THREADS {
        let lock = client
            .lock("demo:observed")
            .map_err(|err| err.to_string())?;
        threads.push(thread::spawn(move || -> Result<(), redbaton::Error> {
            for _ in 0..ROUNDS {
                lock.with_lock(|| thread::sleep(Duration::from_millis(2)))?;
            }
            Ok(())
        }));
    }
    for thread in threads {
        thread
            .join()
            .expect("a demo thread panicked")
            .map_err(|err| err.to_string())?;
    }

    // The first process: a holder with a 300 ms fixed lease that
    // overstays it. Its loss signal fires at the lease's end, without any
    // polling.
    if index == 0 {
        let short = client
            .lock("demo:short")
            .and_then(|lock| lock.with_fixed_lease(Duration::from_millis(300)))
            .map_err(|err| err.to_string())?;
        let guard = short.lock().map_err(|err| err.to_string())?;
        let lost = guard.lost();
        match lost.recv_timeout(Duration::from_secs(5)) {
            Ok(reason) => println!("    process 0: the short lease's holder was told: {reason}"),
            Err(_) => println!("    process 0: the short lease's holder was never told"),
        }
        drop(guard);
    }

    println!("    process {index}'s metrics, as a scrape would see them:");
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
        lines.push(format!("      {id} {shown}"));
    }
    lines.sort();
    for line in &lines {
        println!("{line}");
    }
    println!("TOTAL {acquisitions} {held}");
    Ok(())
}

/// Prints the first events a log would show, then only losses.
fn print_some(process: usize, event: &Event<'_>, printed: &AtomicUsize) {
    let first = printed.fetch_add(1, Ordering::Relaxed) < 4;
    match event {
        Event::Lost { name, reason, .. } => {
            println!("    process {process}: event: lost {name}: {reason}");
        }
        Event::Acquired {
            name, waited, how, ..
        } if first => {
            println!("    process {process}: event: acquired {name} ({how:?}, waited {waited:?})");
        }
        Event::Parked { name, .. } if first => {
            println!("    process {process}: event: parked on {name}")
        }
        _ => {}
    }
}

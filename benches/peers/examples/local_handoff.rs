//! Hand-offs inside one process: 16 threads of one client take one lock in
//! turn for a few seconds, on a private server; prints acquisitions per
//! second, how many went through Redis (`INFO commandstats`), and the
//! process's CPU time and allocations per acquisition. A target for `perf record`:
//!
//!     cargo run --release --manifest-path benches/peers/Cargo.toml --example local_handoff
//!
//! `LOCAL_HANDOFF_SECS` sets the run's length (default 3), `LOCAL_HANDOFF_THREADS`
//! the threads (default 16), `LOCAL_HANDOFF_KIND=fair` takes a fair lock
//! instead of the plain one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

#[path = "../cpu_time.rs"]
mod cpu_time;

/// The system allocator, counting the allocations it makes: the run's
/// allocations per acquisition are printed with its other costs.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn evalsha_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    testkit::parse_commandstats(&info)
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

fn main() {
    let redis = testkit::DemoRedis::from_env().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(1)
    });
    let run = Duration::from_secs(env_or("LOCAL_HANDOFF_SECS", 3));
    let threads = env_or("LOCAL_HANDOFF_THREADS", 16) as usize;
    let mut stats = redis::Client::open(redis.url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let client = redbaton::Client::open(&redis.url).expect("url");
    // Warm up: scripts loaded, connections open.
    let fair = std::env::var("LOCAL_HANDOFF_KIND").is_ok_and(|kind| kind == "fair");
    let open = move |client: &redbaton::Client| {
        if fair {
            client.fair_lock("bench:local-handoff").expect("name")
        } else {
            client.lock("bench:local-handoff").expect("name")
        }
    };
    let lock = open(&client);
    lock.lock().expect("lock").unlock().expect("unlock");

    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (client, start) = (client.clone(), Arc::clone(&start));
            thread::spawn(move || {
                let lock = open(&client);
                lock.lock().expect("lock").unlock().expect("unlock");
                start.wait();
                let (end, mut taken) = (Instant::now() + run, 0u64);
                while Instant::now() < end {
                    lock.lock().expect("lock").unlock().expect("unlock");
                    taken += 1;
                }
                taken
            })
        })
        .collect();
    start.wait();
    let (began, cpu, scripts) = (
        Instant::now(),
        cpu_time::process(),
        evalsha_calls(&mut stats),
    );
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let taken: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    let (wall, cpu) = (began.elapsed(), cpu_time::process() - cpu);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
    let scripts = evalsha_calls(&mut stats) - scripts;
    println!(
        "{threads} threads, {:.1} s: {:.0} acquisitions/s, {:.2} scripts per acquisition, \
         process CPU {:.1} µs and {:.1} allocations per acquisition",
        wall.as_secs_f64(),
        taken as f64 / wall.as_secs_f64(),
        scripts as f64 / taken as f64,
        cpu.as_secs_f64() * 1e6 / taken as f64,
        allocations as f64 / taken as f64,
    );
}

//! Mutual exclusion and crash recovery between real processes: these tests
//! re-run this test binary as child processes (see `child_entry`).

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::spawn_child;
use crate::support::JoinWithin;
use redbaton::{Acquisition, Client, Event};
use testkit::RedisServer;

/// This file's child-process roles (run by the binary's `child_entry`);
/// false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "increment" => increment_worker(url),
        "hold" => hold_worker(url),
        _ => return false,
    }
    true
}

const THREADS_PER_CHILD: usize = 8;
const INCREMENTS_PER_THREAD: usize = 125;

/// 8 threads each do a non-atomic read-modify-write of `counter` under the
/// lock, checking an occupancy marker and the fencing token each time;
/// prints how many acquisitions were local hand-offs.
fn increment_worker(url: &str) {
    let handoffs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&handoffs);
    let client = Client::builder(url)
        .on_event(move |event| {
            if let Event::Acquired {
                how: Acquisition::LocalHandoff,
                ..
            } = event
            {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap();
    let lock = client.lock("counter").unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    println!("READY");
    // Start together with the other child, so that the two really contend.
    let _: (String, String) = redis::cmd("BLPOP")
        .arg("go")
        .arg(10)
        .query(&mut raw)
        .unwrap();

    let workers: Vec<_> = (0..THREADS_PER_CHILD)
        .map(|_| {
            let lock = lock.clone();
            let url = url.to_owned();
            thread::spawn(move || {
                let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
                let (mut overlaps, mut fence_regressions) = (0, 0);
                for _ in 0..INCREMENTS_PER_THREAD {
                    let guard = lock.lock().unwrap();
                    let entered: bool = redis::cmd("SET")
                        .arg("occupant")
                        .arg(std::process::id())
                        .arg("NX")
                        .query(&mut raw)
                        .unwrap();
                    if !entered {
                        overlaps += 1;
                    }
                    let last_fence: u64 = redis::cmd("GET")
                        .arg("last_fence")
                        .query::<Option<u64>>(&mut raw)
                        .unwrap()
                        .unwrap_or(0);
                    if guard.fencing_token() <= last_fence {
                        fence_regressions += 1;
                    }
                    let count: u64 = redis::cmd("GET")
                        .arg("counter")
                        .query::<Option<u64>>(&mut raw)
                        .unwrap()
                        .unwrap_or(0);
                    redis::cmd("SET")
                        .arg("counter")
                        .arg(count + 1)
                        .query::<()>(&mut raw)
                        .unwrap();
                    redis::cmd("SET")
                        .arg("last_fence")
                        .arg(guard.fencing_token())
                        .query::<()>(&mut raw)
                        .unwrap();
                    if entered {
                        redis::cmd("DEL")
                            .arg("occupant")
                            .query::<()>(&mut raw)
                            .unwrap();
                    }
                    guard.unlock().unwrap();
                }
                (overlaps, fence_regressions)
            })
        })
        .collect();
    let (mut overlaps, mut regressions) = (0, 0);
    for worker in workers {
        let (o, r) = worker.joined();
        overlaps += o;
        regressions += r;
    }
    let handoffs = handoffs.load(Ordering::Relaxed);
    println!("RESULT {overlaps} {regressions} {handoffs}");
}

/// Takes the lock with a 1 s lease, says so, and waits to be killed.
fn hold_worker(url: &str) {
    let client = Client::builder(url)
        .default_lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let guard = client.lock("crash").unwrap().lock().unwrap();
    println!("ACQUIRED {}", guard.fencing_token());
    thread::sleep(Duration::from_secs(30));
    panic!("the test should have killed this process");
}

#[test]
fn two_processes_of_eight_threads_never_overlap_and_lose_no_update() {
    two_processes_of_eight_threads(&RedisServer::start());
}

/// As above with the fencing counter a day ahead of the server's clock, so
/// that every token Redis issues is the counter plus one: a thread that
/// takes the lock in Redis after another process's run of in-memory
/// hand-offs (each numbered one above the last) gets a token above them
/// only because the run's ownership set them aside in the counter.
#[test]
fn tokens_grow_across_in_memory_and_redis_hand_offs_with_the_counter_ahead_of_the_clock() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let ahead = secs * 1_000_000 + micros + 86_400_000_000;
    redis::cmd("SET")
        .arg("redbaton:{counter}:fence")
        .arg(ahead)
        .query::<()>(&mut raw)
        .unwrap();
    two_processes_of_eight_threads(&server);
    let last: u64 = redis::cmd("GET").arg("last_fence").query(&mut raw).unwrap();
    assert!(last > ahead, "the counter was ahead: {last} after {ahead}");
}

/// Two processes of eight threads each increment a counter under one lock:
/// no overlap, no lost update, tokens growing in the order of the holds,
/// and local hand-offs among them.
fn two_processes_of_eight_threads(server: &RedisServer) {
    let mut children = [
        spawn_child("increment", server),
        spawn_child("increment", server),
    ];
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    let mut raw = server.connection();
    redis::cmd("RPUSH")
        .arg("go")
        .arg(1)
        .arg(2)
        .query::<()>(&mut raw)
        .unwrap();

    let mut totals = HashMap::new();
    for child in &mut children {
        let results = child.lines_with_prefix_until_exit("RESULT", Duration::from_secs(120));
        assert_eq!(results.len(), 1, "{results:?}");
        let numbers: Vec<u64> = results[0].split(' ').map(|n| n.parse().unwrap()).collect();
        *totals.entry("overlaps").or_insert(0) += numbers[0];
        *totals.entry("fence regressions").or_insert(0) += numbers[1];
        *totals.entry("local hand-offs").or_insert(0) += numbers[2];
    }
    let counter: u64 = redis::cmd("GET").arg("counter").query(&mut raw).unwrap();
    assert_eq!(
        counter,
        2 * (THREADS_PER_CHILD * INCREMENTS_PER_THREAD) as u64
    );
    assert_eq!(counter, 2_000);
    assert_eq!(totals["overlaps"], 0, "two holders were inside at once");
    assert_eq!(
        totals["fence regressions"], 0,
        "a fencing token did not increase"
    );
    println!("local hand-offs: {}", totals["local hand-offs"]);
    assert!(
        totals["local hand-offs"] > 0,
        "the processes' threads never handed the lock on: {totals:?}"
    );
}

#[test]
fn waiter_in_another_process_acquires_soon_after_a_killed_holders_lease_ends() {
    let server = RedisServer::start();
    let mut holder = spawn_child("hold", &server);
    let old_token: u64 = holder
        .wait_for_line("ACQUIRED", Duration::from_secs(30))
        .parse()
        .unwrap();
    let acquired_at = Instant::now();
    holder.kill();

    let client = support::client(&server);
    let lock = client.lock("crash").unwrap();
    let guard = lock.lock().unwrap();
    let waited = acquired_at.elapsed();
    assert!(
        waited < Duration::from_millis(1_200),
        "acquired {waited:?} after the holder took a 1 s lease"
    );
    assert!(
        waited > Duration::from_millis(700),
        "acquired {waited:?}: the dead holder's lease was not respected"
    );
    assert!(guard.fencing_token() > old_token);
}

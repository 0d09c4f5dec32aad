//! Mutual exclusion and crash recovery between real processes: these tests
//! re-run this test binary as child processes (see `child_entry`).

use crate::support;

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::spawn_child;
use crate::support::JoinWithin;
use redbaton::Client;
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
/// lock, checking an occupancy marker and the fencing token each time.
fn increment_worker(url: &str) {
    let client = Client::open(url).unwrap();
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
    println!("RESULT {overlaps} {regressions}");
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
    let server = RedisServer::start();
    let mut children = [
        spawn_child("increment", &server),
        spawn_child("increment", &server),
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

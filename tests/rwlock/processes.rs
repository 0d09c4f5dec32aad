//! Real processes: readers together and writers alone across three
//! processes of four threads; holders and waiting writers that are
//! SIGKILLed. Child processes re-run this test binary (`child_entry`).

use std::thread;
use std::time::{Duration, Instant};

use crate::support::{self, spawn_child, JoinWithin};
use crate::waiting_writers;
use redbaton::Client;
use testkit::RedisServer;

/// This file's child-process roles; false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "mixed" => mixed_worker(url),
        "hold-read" => hold(url, false, Duration::from_secs(1)),
        "hold-read-3s" => hold(url, false, Duration::from_secs(3)),
        "hold-write" => hold(url, true, Duration::from_secs(1)),
        "wait-write" => wait_write(url),
        _ => return false,
    }
    true
}

const PROCESSES: usize = 3;
const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 40;
/// One operation in this many is a write.
const WRITE_EVERY: usize = 4;

/// 4 threads each read or write `OPS_PER_THREAD` times under the lock
/// "shared", checking occupancy markers on the data server: a writer sets
/// `writer` (NX) and sees `readers` at 0; a reader counts itself in
/// `readers` and sees no `writer`. Prints the violations, the most readers
/// seen inside at once, and its reads and writes.
fn mixed_worker(url: &str) {
    let client = Client::open(url).unwrap();
    let lock = client.rw_lock("shared").unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    println!("READY");
    let _: (String, String) = redis::cmd("BLPOP")
        .arg("go")
        .arg(30)
        .query(&mut raw)
        .unwrap();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let lock = lock.clone();
            let url = url.to_owned();
            thread::spawn(move || {
                let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
                let (mut violations, mut most, mut reads, mut writes) = (0u64, 0u64, 0u64, 0u64);
                for op in 0..OPS_PER_THREAD {
                    if (t + op) % WRITE_EVERY == 0 {
                        let guard = lock
                            .try_write_for(Duration::from_secs(60))
                            .unwrap()
                            .unwrap();
                        let alone: bool = redis::cmd("SET")
                            .arg("writer")
                            .arg(std::process::id())
                            .arg("NX")
                            .query(&mut raw)
                            .unwrap();
                        let readers: i64 = redis::cmd("GET")
                            .arg("readers")
                            .query::<Option<i64>>(&mut raw)
                            .unwrap()
                            .unwrap_or(0);
                        if !alone || readers != 0 {
                            violations += 1;
                        }
                        redis::cmd("INCR")
                            .arg("writes")
                            .query::<()>(&mut raw)
                            .unwrap();
                        thread::sleep(Duration::from_millis(1));
                        if alone {
                            redis::cmd("DEL")
                                .arg("writer")
                                .query::<()>(&mut raw)
                                .unwrap();
                        }
                        writes += 1;
                        guard.unlock().unwrap();
                    } else {
                        let guard = lock.try_read_for(Duration::from_secs(60)).unwrap().unwrap();
                        let inside: u64 =
                            redis::cmd("INCR").arg("readers").query(&mut raw).unwrap();
                        most = most.max(inside);
                        let writer: bool =
                            redis::cmd("EXISTS").arg("writer").query(&mut raw).unwrap();
                        if writer {
                            violations += 1;
                        }
                        redis::cmd("INCR")
                            .arg("reads")
                            .query::<()>(&mut raw)
                            .unwrap();
                        thread::sleep(Duration::from_millis(4));
                        redis::cmd("DECR")
                            .arg("readers")
                            .query::<()>(&mut raw)
                            .unwrap();
                        reads += 1;
                        guard.unlock().unwrap();
                    }
                }
                (violations, most, reads, writes)
            })
        })
        .collect();
    let (mut violations, mut most, mut reads, mut writes) = (0, 0, 0, 0);
    for worker in workers {
        let (v, m, r, w) = worker.joined();
        violations += v;
        most = most.max(m);
        reads += r;
        writes += w;
    }
    println!("RESULT {violations} {most} {reads} {writes}");
}

/// Takes "crash" for reading or writing with `lease`, says so, and waits
/// to be killed.
fn hold(url: &str, write: bool, lease: Duration) {
    let client = Client::builder(url).default_lease(lease).build().unwrap();
    let lock = client.rw_lock("crash").unwrap();
    if write {
        let guard = lock.write().unwrap();
        println!("ACQUIRED {}", guard.fencing_token());
        thread::sleep(Duration::from_secs(30));
    } else {
        let guard = lock.read().unwrap();
        println!("ACQUIRED 0");
        thread::sleep(Duration::from_secs(30));
        drop(guard);
    }
    panic!("the test should have killed this process");
}

/// Waits to write "queue" (parking at most 1 s at a time) until killed.
fn wait_write(url: &str) {
    let client = Client::builder(url)
        .max_park(Duration::from_secs(1))
        .build()
        .unwrap();
    let lock = client.rw_lock("queue").unwrap();
    println!("WAITING");
    let guard = lock.try_write_for(Duration::from_secs(60)).unwrap();
    panic!("the test should have killed this process, not given it {guard:?}");
}

#[test]
fn three_processes_of_four_threads_keep_writers_alone_and_readers_together() {
    let server = RedisServer::start();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child("mixed", &server))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    let mut raw = server.connection();
    redis::cmd("RPUSH")
        .arg("go")
        .arg(&[1, 2, 3])
        .query::<()>(&mut raw)
        .unwrap();
    let before = server.command_calls();
    let (mut violations, mut most, mut reads, mut writes) = (0, 0, 0, 0);
    for child in &mut children {
        let results = child.lines_with_prefix_until_exit("RESULT", Duration::from_secs(120));
        assert_eq!(results.len(), 1, "{results:?}");
        let n: Vec<u64> = results[0].split(' ').map(|n| n.parse().unwrap()).collect();
        violations += n[0];
        most = most.max(n[1]);
        reads += n[2];
        writes += n[3];
    }
    let total = (PROCESSES * THREADS * OPS_PER_THREAD) as u64;
    let expected_writes = (PROCESSES * THREADS * OPS_PER_THREAD / WRITE_EVERY) as u64;
    assert_eq!(violations, 0, "a writer was inside with someone else");
    assert_eq!(writes, expected_writes);
    assert_eq!(reads, total - expected_writes);
    let counted = |key: &str, raw: &mut redis::Connection| -> u64 {
        redis::cmd("GET").arg(key).query(raw).unwrap()
    };
    assert_eq!(counted("writes", &mut raw), expected_writes);
    assert_eq!(counted("reads", &mut raw), total - expected_writes);
    assert!(
        most > 1,
        "readers never overlapped: at most {most} inside at once"
    );
    // The hand-offs between the processes went through grants too (read
    // and write grants: about 200 a run), not through batons only.
    let grants = server.commands_since(&before).get("publish").copied();
    assert!(grants.unwrap_or(0) > 0, "no grant in the run");
    println!("at most {most} readers inside at once; {grants:?} grants");
}

/// A child holding "crash" (the lease its role says) is SIGKILLed right after it
/// acquires; returns the child's token and when it acquired.
pub(crate) fn killed_holder(server: &RedisServer, role: &str) -> (u64, Instant) {
    let mut holder = spawn_child(role, server);
    let token: u64 = holder
        .wait_for_line("ACQUIRED", Duration::from_secs(30))
        .parse()
        .unwrap();
    let acquired_at = Instant::now();
    holder.kill();
    (token, acquired_at)
}

#[test]
fn a_sigkilled_reader_frees_the_lock_for_a_writer_when_its_lease_ends() {
    let server = RedisServer::start();
    let (_, acquired_at) = killed_holder(&server, "hold-read");
    let client = support::client(&server);
    let guard = client
        .rw_lock("crash")
        .unwrap()
        .try_write_for(Duration::from_secs(10))
        .unwrap()
        .expect("the dead reader's lease ends");
    let waited = acquired_at.elapsed();
    println!("a writer got in {waited:?} after the killed reader took its 1 s lease");
    assert!(
        waited < Duration::from_millis(1_500),
        "acquired {waited:?} after the reader took a 1 s lease"
    );
    assert!(
        waited > Duration::from_millis(700),
        "acquired {waited:?}: the dead reader's lease was not respected"
    );
    guard.unlock().unwrap();
}

#[test]
fn a_sigkilled_writer_frees_the_lock_for_readers_when_its_lease_ends() {
    let server = RedisServer::start();
    let (token, acquired_at) = killed_holder(&server, "hold-write");
    let client = support::client(&server);
    let lock = client.rw_lock("crash").unwrap();
    let reader = {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.try_read_for(Duration::from_secs(10)).unwrap();
            (guard.is_some(), acquired_at.elapsed())
        })
    };
    let (read, waited) = reader.joined();
    assert!(read, "the dead writer's lease ends");
    println!("a reader got in {waited:?} after the killed writer took its 1 s lease");
    assert!(
        waited < Duration::from_millis(1_500) && waited > Duration::from_millis(700),
        "a reader got in {waited:?} after the writer took a 1 s lease"
    );
    let guard = lock.try_write_for(Duration::from_secs(5)).unwrap().unwrap();
    assert!(guard.fencing_token() > token, "fencing tokens grow");
}

#[test]
fn a_sigkilled_waiting_writer_stops_holding_readers_back_within_one_park() {
    let server = RedisServer::start();
    let reader = support::client(&server);
    let held = reader.rw_lock("queue").unwrap().read().unwrap();
    let mut writer = spawn_child("wait-write", &server);
    writer.wait_for_line("WAITING", Duration::from_secs(30));
    let mut raw = server.connection();
    support::eventually(Duration::from_secs(10), "the writer's place", || {
        waiting_writers(&mut raw, "queue") == 1
    });
    let other = support::client(&server);
    let lock = other.rw_lock("queue").unwrap();
    assert!(
        lock.try_read().unwrap().is_none(),
        "a fresh reader waits behind the waiting writer"
    );
    writer.kill();
    let killed_at = Instant::now();
    let guard = lock
        .try_read_for(Duration::from_secs(10))
        .unwrap()
        .expect("the dead writer's place ends");
    let waited = killed_at.elapsed();
    println!("a reader got in {waited:?} after the waiting writer was killed");
    // Its place lasts one park (1 s) + 500 ms from its last attempt.
    assert!(
        waited < Duration::from_millis(2_500),
        "a reader waited {waited:?} behind a dead writer"
    );
    assert_eq!(waiting_writers(&mut raw, "queue"), 0);
    drop(guard);
    held.unlock().unwrap();
}

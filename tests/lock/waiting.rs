//! What waiting costs: commands sent while parked, connections held, and
//! releases that must not queue behind waiters.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::eventually;
use crate::support::JoinWithin;
use redbaton::Client;
use testkit::RedisServer;

#[test]
fn twenty_waiters_during_a_three_second_hold_send_a_bounded_number_of_commands() {
    const WAITERS: u64 = 20;
    const HOLD: Duration = Duration::from_secs(3);
    const MAX_PARK: Duration = Duration::from_secs(1);

    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(MAX_PARK)
        .build()
        .unwrap();
    let lock = client.lock("popular").unwrap();
    let held = lock.lock().unwrap();

    let before = server.command_calls();
    let (done, finished) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = lock.clone();
            let done = done.clone();
            thread::spawn(move || {
                let guard = lock.lock().unwrap();
                drop(guard);
                done.send(()).unwrap();
            })
        })
        .collect();
    thread::sleep(HOLD);
    let during = server.commands_since(&before);
    // The process waits on one parked name.
    let parked = support::parked(&server);
    held.unlock().unwrap();
    for _ in 0..WAITERS {
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("every waiter gets the lock");
    }
    for waiter in waiters {
        waiter.joined();
    }

    // What the clients sent; INFO commandstats also counts the commands that
    // scripts run inside the server (hmget, pttl, ...), which cost no round
    // trip.
    let sent = [
        "evalsha",
        "eval",
        "script|load",
        "blpop",
        "incr",
        "exists",
        "llen",
        "lpop",
    ];
    let total: u64 = sent.iter().filter_map(|c| during.get(*c)).sum();
    let parks_per_waiter = HOLD.as_millis() as u64 / MAX_PARK.as_millis() as u64;
    // First attempts (one script call, one INCR for a new thread's identity)
    // plus a small multiple of waiters × hold / max park.
    let bound = 2 * WAITERS + 2 * WAITERS * parks_per_waiter;
    println!("commands sent during the hold: {total} (bound {bound}); all: {during:?}");
    assert!(total <= bound, "{total} commands > {bound}: {during:?}");
    // One thread parks for the whole process: its name is looked at
    // (`LLEN` registers it for an announcement) when it parks, and again
    // only when its park ends.
    assert_eq!(parked, 1, "names parked on during the hold");
    let looks = ["blpop", "llen"]
        .iter()
        .filter_map(|c| during.get(*c))
        .sum::<u64>();
    assert!(
        looks <= parks_per_waiter + 2,
        "{looks} parks (BLPOPs and LLENs): {during:?}"
    );
}

#[test]
fn a_thousand_local_waiters_park_one_connection() {
    let server = RedisServer::start();
    // A thousand threads start at once and queue for 4 connections (their
    // identity, their first look): on a loaded 2-core machine that queue
    // can outlast the default 3 s I/O timeout, which bounds a wait for a
    // pooled connection (`PoolTimeout` seen in CI).
    let client = Client::builder(server.url())
        .pool_size(4)
        .io_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.lock("crowded").unwrap();
    let held = lock.lock().unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let (done, finished) = mpsc::channel();
    let waiters: Vec<_> = (0..1000)
        .map(|_| {
            let (lock, started, done) = (lock.clone(), Arc::clone(&started), done.clone());
            thread::Builder::new()
                // Small, so that a thousand threads stay cheap, with room
                // for a debug build's frames (64 KiB overflowed now and
                // then once the wait path grew: replica confirmations, the
                // fair lock's arrival).
                .stack_size(128 * 1024)
                .spawn(move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    let guard = lock.try_lock_for(Duration::from_secs(60)).unwrap();
                    done.send(guard.is_some()).unwrap();
                })
                .unwrap()
        })
        .collect();
    support::eventually(Duration::from_secs(30), "waiters to start", || {
        started.load(Ordering::SeqCst) == 1000
    });
    let mut raw = server.connection();
    let mut parked = 0;
    support::eventually(Duration::from_secs(30), "a parked waiter", || {
        parked = support::parked(&server);
        parked > 0
    });
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut raw).unwrap();
    let connections = clients.lines().count();
    assert_eq!(parked, 1, "one parker for 1000 waiting threads");
    assert_eq!(blocked_clients(&mut raw), 0, "nothing blocks in Redis");
    // 4 command connections, the parking hub's 2, and this test's own.
    assert!(connections <= 7, "{connections} connections:\n{clients}");
    held.unlock().unwrap();
    for _ in 0..1000 {
        assert!(finished.recv_timeout(Duration::from_secs(60)).unwrap());
    }
    for waiter in waiters {
        waiter.joined();
    }
}

#[test]
fn thirty_two_threads_on_a_pool_of_two_all_finish_and_releases_never_wait_for_parkers() {
    const THREADS: usize = 32;
    const ROUNDS: usize = 5;
    let server = RedisServer::start();
    // A long maximum park: a release stuck behind a parked waiter would take
    // seconds, far beyond the bound below.
    let client = Client::builder(server.url())
        .pool_size(2)
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = client.lock("narrow").unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let (done, finished) = mpsc::channel();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (lock, inside, entries, start, done) = (
                lock.clone(),
                Arc::clone(&inside),
                Arc::clone(&entries),
                Arc::clone(&start),
                done.clone(),
            );
            thread::spawn(move || {
                start.wait();
                let mut slowest_release = Duration::ZERO;
                for _ in 0..ROUNDS {
                    let guard = lock.lock().unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    entries.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(1));
                    inside.store(false, Ordering::SeqCst);
                    let releasing = Instant::now();
                    guard.unlock().unwrap();
                    slowest_release = slowest_release.max(releasing.elapsed());
                }
                done.send(slowest_release).unwrap();
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..THREADS {
        slowest = slowest.max(
            finished
                .recv_timeout(Duration::from_secs(60))
                .expect("every thread finishes"),
        );
    }
    for thread in threads {
        thread.joined();
    }
    assert_eq!(entries.load(Ordering::SeqCst), THREADS * ROUNDS);
    println!("slowest release: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(1),
        "a release waited {slowest:?}"
    );
}

fn blocked_clients(raw: &mut redis::Connection) -> u32 {
    let info: String = redis::cmd("INFO").arg("clients").query(raw).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[test]
fn a_park_longer_than_the_io_timeout_is_not_an_error() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(200))
        .max_park(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = client.lock("long-park").unwrap();
    let held = lock.lock().unwrap();
    let waiter = lock.clone();
    let handle = thread::spawn(move || {
        waiter
            .try_lock_for(Duration::from_secs(5))
            .map(|g| g.is_some())
    });
    eventually(Duration::from_secs(5), "the waiter parks", || {
        support::parked(&server) == 1
    });
    // Parked past several I/O timeouts.
    thread::sleep(Duration::from_millis(1_000));
    held.unlock().unwrap();
    let got = handle.joined();
    assert!(matches!(got, Ok(true)), "{got:?}");
}

#[test]
fn a_release_on_a_pool_of_one_never_waits_for_a_parked_waiter() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .pool_size(1)
        .max_park(Duration::from_secs(10))
        .io_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let lock = client.lock("one").unwrap();
    let held = lock.lock().unwrap();
    let waiter = lock.clone();
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let got = waiter
            .try_lock_for(Duration::from_secs(20))
            .unwrap()
            .is_some();
        tx.send(got).unwrap();
    });
    eventually(Duration::from_secs(5), "the waiter to park", || {
        support::parked(&server) == 1
    });
    let start = Instant::now();
    held.unlock().unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    assert!(rx.recv_timeout(Duration::from_secs(2)).unwrap());
    handle.joined();
}

#[test]
fn waiters_beyond_the_parking_connections_still_acquire() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .parking_connections(1)
        .max_park(Duration::from_secs(10))
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let locks = [client.lock("a").unwrap(), client.lock("b").unwrap()];
    let held: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
    let waiters: Vec<_> = locks
        .iter()
        .map(|l| {
            let l = l.clone();
            thread::spawn(move || l.try_lock_for(Duration::from_secs(5)).map(|g| g.is_some()))
        })
        .collect();
    thread::sleep(Duration::from_millis(800));
    for guard in held {
        guard.unlock().unwrap();
    }
    for waiter in waiters {
        let got = waiter.joined();
        assert!(matches!(got, Ok(true)), "{got:?}");
    }
}

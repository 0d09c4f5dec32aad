//! Local hand-off: a releasing thread passes the lock straight to a waiting
//! thread of its own process, in order, without starving other processes,
//! and never to a thread that has given up.

use crate::across_topologies;
use crate::support::lock_key;
use crate::support::{Deployment, Topology};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::JoinWithin;
use crate::support::{eventually, is_asleep, parked, spawn_child, thread_id};
use crate::support::{hand_off_commands, scripts_run};
use redbaton::Client;
use testkit::RedisServer;

/// This file's child-process roles (run by the binary's `child_entry`);
/// false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    if role != "remote-waiter" {
        return false;
    }
    let client = Client::open(url).unwrap();
    let lock = client.lock("busy").unwrap();
    println!("READY");
    let start = Instant::now();
    let guard = lock.try_lock_for(Duration::from_secs(10)).unwrap();
    println!("WAITED {} {}", guard.is_some(), start.elapsed().as_millis());
    true
}

across_topologies! {
    fn local_waiters_get_the_lock_handed_over_in_arrival_order_without_baton_or_round_trip(deployment) {
        let servers = deployment.servers_for(&lock_key("queue"));
        // The counts below are exact: the parker's park (60 s) ends only by
        // the baton, so it makes no attempt of its own meanwhile, and a
        // master of a quorum is waited for (2 s) rather than counted out of
        // a round, so no round is undone and sent again.
        // A run as long as it takes: the four hand-offs in a row, however
        // slow the machine.
        let client = deployment
            .builder()
            .max_park(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(2))
            .max_local_run(Duration::from_secs(60))
            .build()
            .unwrap();
        let lock = client.lock("queue").unwrap();
        let held = lock.lock().unwrap();
        let (tx, rx) = mpsc::channel();
        let (ready, queued) = mpsc::channel();
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (lock, tx, ready) = (lock.clone(), tx.clone(), ready.clone());
            waiters.push(thread::spawn(move || {
                // The thread's identity (one INCR) and a first look, before
                // the count starts.
                assert!(lock.try_lock().unwrap().is_none());
                ready.send(thread_id()).unwrap();
                let guard = lock
                    .try_lock_for(Duration::from_secs(30))
                    .unwrap()
                    .expect("handed over");
                tx.send(i).unwrap();
                drop(guard);
            }));
            // Each waiter queues before the next one starts: the first
            // parks in Redis; the others send nothing more and wait in
            // their process's queue (asleep on it).
            let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
            if i == 0 {
                eventually(Duration::from_secs(10), "the first waiter parked", || {
                    servers.iter().map(|s| parked(s)).sum::<u64>() == 1
                });
            } else {
                eventually(Duration::from_secs(10), "the waiter queued", || is_asleep(tid));
            }
        }
        let server = servers[0];
        let before = server.command_calls();
        held.unlock().unwrap();
        let order: Vec<i32> = (0..5)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        for waiter in waiters {
            waiter.joined();
        }
        let used = server.commands_since(&before);
        // The first waiter parks in Redis; the others are served locally, oldest
        // first, and the parker gets the lock last, by the baton.
        assert_eq!(order, vec![1, 2, 3, 4, 0], "{used:?}");
        // 4 hand-offs (in memory, but on a quorum) + 1 global release, 1
        // acquisition by the parker, and its release: no waiter sent an
        // acquire of its own.
        // (An EVALSHA answered NOSCRIPT, before a script's first SCRIPT LOAD,
        // is not one of them.)
        // (On a quorum too: the masters take the proposed fencing token
        // as it is, so no ownership needs a second round to agree on one.
        // But a quorum's parker is woken by the baton of the first master
        // the global release reached, and its attempt may meet masters the
        // release has not reached yet: without a majority it is undone on
        // every master and sent again, two scripts more per retry. Retries
        // are counted, not guessed: every attempt writes the lock hash
        // once (HSET: taken, or marked as waited for), as each hand-off
        // does; the global release writes none, since it opens no
        // hand-over window: the parker that found the lock in its way is
        // of the holder's own client; undos write none.)
        // Except on a quorum, a hand-off sends nothing at all: the
        // ownership passes in memory (under the next fencing token), and
        // only the global release, the parker's acquisition and its
        // release reach Redis.
        let loads = used.get("script|load").copied().unwrap_or(0);
        let scripts = used.get("evalsha").copied().unwrap_or(0) - loads;
        let handoff_scripts = if deployment.is_quorum() { 4 } else { 0 };
        let attempts = used.get("hset").copied().unwrap_or(0) - handoff_scripts;
        let retried = attempts - 1;
        if deployment.is_quorum() {
            assert!(retried <= 2, "the parker retried {retried} times: {used:?}");
        } else {
            assert_eq!(retried, 0, "only the parker attempts, once: {used:?}");
            assert_eq!(used.get("rpush"), Some(&2), "batons: {used:?}");
        }
        assert_eq!(scripts, 3 + handoff_scripts + 2 * retried, "{used:?}");
    }
}

#[test]
fn a_waiter_in_another_process_gets_the_lock_while_local_threads_keep_contending() {
    let deployment = Deployment::start(Topology::Single);
    let (server, client) = (deployment.server(), deployment.client());
    let millis = remote_wait_among_local_contenders(server, &client, Duration::from_millis(1));
    assert!(millis < 1_000, "waited {millis} ms");
}

/// With hand-offs in a row allowed by the thousand, the run's time bound
/// is what lets the other process in: 8 local threads holding 5 ms each
/// would otherwise keep the lock for seconds.
#[test]
fn a_run_of_local_hand_offs_ends_at_max_local_run() {
    let deployment = Deployment::start(Topology::Single);
    let server = deployment.server();
    let client = deployment
        .builder()
        .max_local_handoffs(1_000_000)
        .max_local_run(Duration::from_millis(20))
        .build()
        .unwrap();
    let millis = remote_wait_among_local_contenders(server, &client, Duration::from_millis(5));
    // A run or two (20 ms each), a critical section (5 ms) and the Redis
    // cycle: 52 ms measured; the bound leaves room for a loaded machine,
    // and without the time bound the wait runs to its 10 s deadline.
    assert!(millis < 1_500, "waited {millis} ms");
}

/// How long (ms) a waiter in another process waits for the lock while 8
/// threads of `client` take it in turn, each holding it `hold`.
fn remote_wait_among_local_contenders(
    server: &RedisServer,
    client: &Client,
    hold: Duration,
) -> u64 {
    let lock = client.lock("busy").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let locals: Vec<_> = (0..8)
        .map(|_| {
            let (lock, stop, rounds) = (lock.clone(), Arc::clone(&stop), Arc::clone(&rounds));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.lock().unwrap();
                    rounds.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(hold);
                    drop(guard);
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(5), "local contention", || {
        rounds.load(Ordering::Relaxed) > 50
    });
    let mut remote = spawn_child("remote-waiter", server);
    remote.wait_for_line("READY", Duration::from_secs(30));
    let waited = remote.wait_for_line("WAITED", Duration::from_secs(15));
    stop.store(true, Ordering::Relaxed);
    for local in locals {
        local.joined();
    }
    let (got, millis) = waited.split_once(' ').unwrap();
    assert_eq!(got, "true", "the remote waiter got the lock");
    let millis: u64 = millis.parse().unwrap();
    println!("remote waiter waited {millis} ms among 8 local threads holding {hold:?} each");
    millis
}

across_topologies! {
    fn waiters_that_give_up_are_never_handed_the_lock(deployment) {
        let client = deployment.client();
        let lock = client.lock("impatient").unwrap();
        for round in 0..30u64 {
            let held = lock.lock().unwrap();
            let deadline = Instant::now() + Duration::from_millis(20);
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let lock = lock.clone();
                    thread::spawn(move || lock.try_lock_until(deadline).unwrap().map(|g| g.unlock()))
                })
                .collect();
            // Release around the waiters' deadline.
            thread::sleep(Duration::from_micros(17_000 + 200 * round));
            held.unlock().unwrap();
            for waiter in waiters {
                if let Some(unlocked) = waiter.joined() {
                    unlocked.unwrap();
                }
            }
            // Nobody holds the lock now: it was not handed to a thread that left.
            assert_eq!(lock.holder().unwrap(), None, "round {round}");
        }
    }
}

#[test]
fn a_failed_hand_off_is_reported_to_the_releaser_and_the_waiter_still_gets_the_lock() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(300))
        .default_lease(Duration::from_secs(1))
        .build()
        .unwrap();
    // A fixed lease: the hand-off goes through Redis (a renewed one passes
    // in memory, with nothing to fail).
    let lock = client
        .lock("stalled")
        .unwrap()
        .with_fixed_lease(Duration::from_secs(1))
        .unwrap();
    let held = lock.lock().unwrap();
    // Two waiters: the first parks in Redis, the second is handed over to.
    let (tx, rx) = mpsc::channel();
    let (ready, queued) = mpsc::channel();
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let (lock, tx, ready) = (lock.clone(), tx.clone(), ready.clone());
            let waiter = thread::spawn(move || {
                // The thread's identity and a first look, then the wait.
                assert!(lock.try_lock().unwrap().is_none());
                ready.send(thread_id()).unwrap();
                let got = lock.try_lock_for(Duration::from_secs(10)).unwrap();
                tx.send(got.is_some()).unwrap();
            });
            let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
            if i == 0 {
                eventually(Duration::from_secs(10), "the first waiter parks", || {
                    parked(&server) == 1
                });
            } else {
                eventually(Duration::from_secs(10), "the second waiter queues", || {
                    is_asleep(tid)
                });
            }
            waiter
        })
        .collect();
    let mut raw = server.connection();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(800)
        .arg("WRITE")
        .query::<()>(&mut raw)
        .unwrap();
    let err = held.unlock().unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    // Whether the hand-off ran or not, both waiters end up with the lock in
    // turn, within the holder's lease and the pause.
    for _ in 0..2 {
        assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap());
    }
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(lock.holder().unwrap(), None);
}

#[test]
fn mutual_exclusion_holds_across_hand_offs_and_global_releases() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_local_handoffs(3)
        .build()
        .unwrap();
    let lock = client.lock("exclusive").unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..12)
        .map(|_| {
            let (lock, inside, entries) = (lock.clone(), Arc::clone(&inside), Arc::clone(&entries));
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..40 {
                    let guard = lock.lock().unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    assert!(guard.fencing_token() > last);
                    last = guard.fencing_token();
                    entries.fetch_add(1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    drop(guard);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.joined();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 12 * 40);
    assert_eq!(lock.holder().unwrap(), None);
}

/// A waiter of another client is woken by its parking hub at the baton
/// list's announcement and pops the baton in its own attempt: no look
/// (`LLEN` + `LPOP`) comes between the release and that attempt, which
/// is what a hand-off between processes waited a round trip for. (A
/// waiter the server refuses the grant channel to: others are granted the
/// lock, see the next test.)
#[test]
fn a_waiter_of_another_client_takes_the_baton_in_its_attempt_without_a_look() {
    let deployment = Deployment::start(Topology::Single);
    let server = deployment.server();
    let holder = deployment.client();
    let waiting = Client::builder(crate::support::without_grants(server, &server.url()))
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.lock("rung").unwrap().lock().unwrap();
    let lock = waiting.lock("rung").unwrap();
    let wait = move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("woken by the release");
        guard.unlock().unwrap();
    };
    let used = hand_off_commands(server, wait, || held.unlock().unwrap());
    // The release (one script), the waiter's attempt (one script, which
    // pops the baton) and its release: no look, and no attempt that
    // found the lock held (HSET: the release's hand-over window aside,
    // the acquisition only).
    assert_eq!(used.get("llen"), None, "{used:?}");
    assert_eq!(used.get("lpop"), Some(&1), "{used:?}");
    assert_eq!(scripts_run(&used), 3, "{used:?}");
}

/// A waiter of another client parked on its hub is granted the lock by the
/// release: the release's script writes the waiter's ownership and tells
/// its client on the client's grant channel, and the waiter wakes holding
/// it. No look, no attempt of its own: the release and the waiter's own
/// release are the only scripts, and its guard is fenced above the
/// holder's.
#[test]
fn a_waiter_of_another_client_is_granted_the_lock_without_an_attempt() {
    let deployment = Deployment::start(Topology::Single);
    let server = deployment.server();
    let holder = deployment.client();
    let waiting = deployment
        .builder()
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.lock("granted").unwrap().lock().unwrap();
    let held_token = held.fencing_token();
    let lock = waiting.lock("granted").unwrap();
    let (tell, told) = mpsc::channel();
    let mut raw = server.connection();
    let wait = move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("granted by the release");
        let in_redis: u64 = redis::cmd("HGET")
            .arg(lock_key("granted"))
            .arg("fence")
            .query(&mut raw)
            .unwrap();
        tell.send((guard.fencing_token(), in_redis)).unwrap();
        guard.unlock().unwrap();
    };
    let used = hand_off_commands(server, wait, || held.unlock().unwrap());
    let (token, in_redis) = told.recv().unwrap();
    assert!(token > held_token, "{token} after {held_token}");
    assert_eq!(token, in_redis, "the guard's token is the ownership's");
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    // One baton: the waiter's own release's (a granted ownership is
    // marked as waited for: others may be parked), not the holder's.
    assert_eq!(used.get("rpush"), Some(&1), "{used:?}");
    assert_eq!(scripts_run(&used), 2, "{used:?}");
}

/// Eight threads of one client take one lock in a tight loop (empty
/// critical sections), where a release mostly goes to a waiter still
/// awake rather than to the oldest, asleep: every thread is served often,
/// and none waits long (6-10 ms measured, in a debug build: the runs of
/// local hand-offs end every 2 ms, and within them the oldest waiter is
/// passed over 0.5 ms at most).
#[test]
fn threads_taking_a_lock_in_a_tight_loop_are_each_served_within_a_bounded_wait() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lock = client.lock("tight").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (lock, stop) = (lock.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                let (mut taken, mut longest) = (0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let guard = lock.lock().unwrap();
                    longest = longest.max(asked.elapsed());
                    taken += 1;
                    drop(guard);
                }
                (taken, longest)
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let served: Vec<(u64, Duration)> = threads.into_iter().map(|t| t.joined()).collect();
    println!("acquisitions and longest wait of each thread: {served:?}");
    let total: u64 = served.iter().map(|(taken, _)| taken).sum();
    for (taken, longest) in &served {
        assert!(
            *taken * 8 * 10 >= total,
            "a tenth of a fair share at least: {served:?}"
        );
        assert!(*longest < Duration::from_millis(500), "{served:?}");
    }
}

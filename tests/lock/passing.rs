//! In-memory hand-offs: a releasing thread passes its ownership to a
//! waiting thread of its own client without a word to Redis. The new
//! holder re-enters it, renews it, loses it and releases it like any
//! holder; the thread that took it in Redis cannot take it back for a
//! leftover of its own; tokens keep growing; the run goes through Redis
//! after `max_local_handoffs`.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::support::JoinWithin;
use crate::support::{eventually, is_asleep, parked, thread_id};
use redbaton::{Client, Lock, LostReason};
use testkit::RedisServer;

/// A client whose parked waiters wait for the baton alone (a 60 s park).
fn patient(server: &RedisServer, lease: Duration) -> Client {
    Client::builder(server.url())
        .max_park(Duration::from_secs(60))
        .default_lease(lease)
        .build()
        .unwrap()
}

/// Starts a waiter that parks in Redis for its client, then one that
/// queues behind it in the process (the one a release hands the lock to),
/// each running `work` once it has the lock.
fn parker_and_queued<F>(
    server: &RedisServer,
    lock: &Lock,
    work: [F; 2],
) -> Vec<thread::JoinHandle<()>>
where
    F: FnOnce(Lock) + Send + 'static,
{
    let (ready, queued) = mpsc::channel();
    work.into_iter()
        .enumerate()
        .map(|(i, work)| {
            let (lock, ready) = (lock.clone(), ready.clone());
            let waiter = thread::spawn(move || {
                // The thread's identity and a first look, then the wait.
                assert!(lock.try_lock().unwrap().is_none());
                ready.send(thread_id()).unwrap();
                work(lock);
            });
            let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
            if i == 0 {
                eventually(Duration::from_secs(10), "the first waiter parks", || {
                    parked(server) == 1
                });
            } else {
                eventually(Duration::from_secs(10), "the second waiter queues", || {
                    is_asleep(tid)
                });
            }
            waiter
        })
        .collect()
}

#[test]
fn a_thread_handed_the_lock_in_memory_re_enters_it_and_its_first_taker_cannot_take_it_back() {
    let server = RedisServer::start();
    let client = patient(&server, Duration::from_secs(30));
    let lock = client.lock("passed").unwrap();
    let first = lock.lock().unwrap();
    let token = first.fencing_token();
    let taker = lock.holder().unwrap().unwrap().owner;
    let (got, told) = mpsc::channel();
    let (go, wait) = mpsc::channel::<()>();
    let parker_got = got.clone();
    let waiters = parker_and_queued(
        &server,
        &lock,
        [
            Box::new(move |lock: Lock| {
                let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                parker_got
                    .send(("parker", guard.fencing_token(), 0))
                    .unwrap();
            }) as Box<dyn FnOnce(Lock) + Send>,
            Box::new(move |lock: Lock| {
                let outer = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                let inner = lock.lock().unwrap();
                assert_eq!(inner.fencing_token(), outer.fencing_token(), "re-entry");
                assert!(lock.is_held_by_current_thread());
                let depth = lock.holder().unwrap().unwrap().depth;
                got.send(("queued", outer.fencing_token(), depth)).unwrap();
                wait.recv_timeout(Duration::from_secs(20)).unwrap();
                inner.unlock().unwrap();
                assert!(lock.is_held_by_current_thread(), "the outer guard holds");
                outer.unlock().unwrap();
            }),
        ],
    );
    let before = server.command_calls();
    first.unlock().unwrap();
    let (who, passed, depth) = told.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((who, passed, depth), ("queued", token + 1, 2));
    let used = server.commands_since(&before);
    // The release itself sent nothing: only the re-entry and the holder
    // read went to Redis (an EVALSHA each).
    assert_eq!(used.get("evalsha"), Some(&2), "{used:?}");
    assert_eq!(used.get("hset"), Some(&1), "the re-entry's depth: {used:?}");

    // In Redis, the lock is still the first taker's ownership.
    let holder = lock.holder().unwrap().unwrap();
    assert_eq!((holder.owner, holder.fencing_token), (taker, token));
    assert!(!lock.is_held_by_current_thread());
    // The first taker's identity is on it, but it is not its leftover:
    // neither it nor a newcomer gets it.
    assert!(
        lock.try_lock().unwrap().is_none(),
        "taken back by its first taker"
    );
    let newcomer = lock.clone();
    assert!(thread::spawn(move || newcomer.try_lock().unwrap().is_none()).joined());
    assert_eq!(lock.holder().unwrap().unwrap().fencing_token, token);

    go.send(()).unwrap();
    // The parker gets it through Redis, under a token above every token
    // the tokens set aside for in-memory hand-offs (64 by default).
    let (who, parked, _) = told.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(who, "parker");
    assert!(parked > token + 64, "{parked} after {token}");
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(lock.holder().unwrap(), None);
}

#[test]
fn a_lock_lost_while_passed_in_memory_is_told_to_its_holder() {
    let server = RedisServer::start();
    // Renewed every 0.5 s: a renewal may come a second late on a loaded
    // machine before the lease runs out.
    let lease = Duration::from_millis(1_500);
    let client = patient(&server, lease);
    let lock = client.lock("passed-lost").unwrap();
    let first = lock.lock().unwrap();
    let (held, holding) = mpsc::channel();
    let (reason, told) = mpsc::channel();
    let waiters = parker_and_queued(
        &server,
        &lock,
        [
            Box::new(|lock: Lock| {
                // Gets it once the lost ownership is gone from Redis.
                let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
                assert!(guard.is_some(), "the parker got the freed lock");
            }) as Box<dyn FnOnce(Lock) + Send>,
            Box::new(move |lock: Lock| {
                let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                let lost = guard.lost();
                held.send(()).unwrap();
                let why = lost.recv_timeout(Duration::from_secs(10));
                reason.send((why, guard.is_lost())).unwrap();
                assert!(guard.unlock().unwrap_err().is_lost());
            }),
        ],
    );
    first.unlock().unwrap();
    holding.recv_timeout(Duration::from_secs(10)).unwrap();
    // Renewed meanwhile, under the first taker's identity: four renewals
    // (one per third of the lease) take it past its first lease's end,
    // and it lives on.
    let renewed = client.watchdog_stats().renewals;
    eventually(
        Duration::from_secs(10),
        "four renewals while passed",
        || client.watchdog_stats().renewals >= renewed + 4,
    );
    assert!(lock.is_locked().unwrap(), "renewed while passed");
    assert!(lock.force_unlock().unwrap());
    let (why, lost) = told.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(why, Ok(LostReason::Gone));
    assert!(lost);
    for waiter in waiters {
        waiter.joined();
    }
}

#[test]
fn a_set_over_a_name_passed_in_memory_re_enters_it() {
    let server = RedisServer::start();
    let client = patient(&server, Duration::from_secs(30));
    let lock = client.lock("passed-a").unwrap();
    let first = lock.lock().unwrap();
    let token = first.fencing_token();
    let (done, finished) = mpsc::channel();
    let (go, wait) = mpsc::channel::<()>();
    let set_client = client.clone();
    let waiters = parker_and_queued(
        &server,
        &lock,
        [
            Box::new(|lock: Lock| {
                drop(lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap());
            }) as Box<dyn FnOnce(Lock) + Send>,
            Box::new(move |lock: Lock| {
                let single = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                let set = set_client.multi_lock(["passed-a", "passed-b"]).unwrap();
                let both = set.try_lock().unwrap().expect("a is this thread's");
                assert_eq!(both.fencing_token("passed-a"), Some(single.fencing_token()));
                let depth = lock.holder().unwrap().unwrap().depth;
                both.unlock().unwrap();
                let after = lock.holder().unwrap().unwrap().depth;
                done.send((single.fencing_token(), depth, after)).unwrap();
                wait.recv_timeout(Duration::from_secs(20)).unwrap();
                single.unlock().unwrap();
            }),
        ],
    );
    first.unlock().unwrap();
    let (passed, depth, after) = finished.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((passed, depth, after), (token + 1, 2, 1));
    // The first taker, whose identity the name carries in Redis, asks for
    // a set with it: not its leftover, so the set is not taken.
    let set = client.multi_lock(["passed-a", "passed-b"]).unwrap();
    assert!(set.try_lock().unwrap().is_none(), "a taken back in a set");
    assert!(!client.lock("passed-b").unwrap().is_locked().unwrap());
    go.send(()).unwrap();
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(lock.holder().unwrap(), None);
}

#[test]
fn a_waiter_asking_for_another_lease_gets_a_fresh_ownership_from_redis() {
    let server = RedisServer::start();
    let client = patient(&server, Duration::from_secs(30));
    let lock = client.lock("fresh").unwrap();
    let first = lock.lock().unwrap();
    let token = first.fencing_token();
    let (got, told) = mpsc::channel();
    let waiters = parker_and_queued(
        &server,
        &lock,
        [
            Box::new(|lock: Lock| {
                drop(lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap());
            }) as Box<dyn FnOnce(Lock) + Send>,
            Box::new(move |lock: Lock| {
                let short = lock.with_fixed_lease(Duration::from_secs(5)).unwrap();
                let guard = short
                    .try_lock_for(Duration::from_secs(20))
                    .unwrap()
                    .unwrap();
                let holder = lock.holder().unwrap().unwrap();
                got.send((guard.fencing_token(), holder)).unwrap();
            }),
        ],
    );
    let owner = lock.holder().unwrap().unwrap().owner;
    first.unlock().unwrap();
    let (fresh, holder) = told.recv_timeout(Duration::from_secs(10)).unwrap();
    // The hand-off script made it the waiter's, under a token Redis issued
    // above the tokens set aside for the first ownership.
    assert!(fresh > token + 64, "{fresh} after {token}");
    assert_eq!(holder.fencing_token, fresh);
    assert_ne!(holder.owner, owner);
    assert!(holder.remaining_lease.unwrap() <= Duration::from_secs(5));
    for waiter in waiters {
        waiter.joined();
    }
}

#[test]
fn a_run_of_in_memory_hand_offs_ends_after_max_local_handoffs() {
    const WAITERS: usize = 7;
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(60))
        .max_local_handoffs(3)
        // The count ends the run here, not the time (a loaded machine).
        .max_local_run(Duration::from_secs(60))
        .build()
        .unwrap();
    let lock = client.lock("run").unwrap();
    let first = lock.lock().unwrap();
    let (got, served) = mpsc::channel();
    let (ready, queued) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (lock, got, ready) = (lock.clone(), got.clone(), ready.clone());
            let waiter = thread::spawn(move || {
                assert!(lock.try_lock().unwrap().is_none());
                ready.send(thread_id()).unwrap();
                let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                got.send((i, guard.fencing_token())).unwrap();
            });
            let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
            if i == 0 {
                eventually(Duration::from_secs(10), "the first waiter parks", || {
                    parked(&server) == 1
                });
            } else {
                eventually(Duration::from_secs(10), "the waiter queues", || {
                    is_asleep(tid)
                });
            }
            waiter
        })
        .collect();
    let mut tokens = vec![first.fencing_token()];
    first.unlock().unwrap();
    let order: Vec<usize> = (0..WAITERS)
        .map(|_| {
            let (i, token) = served.recv_timeout(Duration::from_secs(10)).unwrap();
            tokens.push(token);
            i
        })
        .collect();
    for waiter in waiters {
        waiter.joined();
    }
    // Three in memory (one above the other), then through Redis: the
    // parker, under a token above the three set aside; then the next run.
    assert_eq!(order[..4], [1, 2, 3, 0], "{order:?} {tokens:?}");
    let steps: Vec<u64> = tokens.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(steps[..3], [1, 1, 1], "{tokens:?}");
    assert!(steps[3] > 1, "through Redis: {tokens:?}");
    assert!(steps.iter().all(|&step| step >= 1), "{tokens:?}");
}

/// A waiter that parks in Redis (the first of its client) until `patience`
/// ends, or until it gets the lock: its token, if it does.
fn spawn_parker(
    server: &RedisServer,
    lock: &Lock,
    patience: Duration,
) -> thread::JoinHandle<Option<u64>> {
    let lock = lock.clone();
    let before = server.command_calls();
    let parker = thread::spawn(move || {
        let guard = lock.try_lock_for(patience).unwrap()?;
        Some(guard.fencing_token())
    });
    // Its first attempt, then the parker's own before it parks: queued by
    // then (a parked connection may already block on the name, for an
    // earlier parker).
    eventually(Duration::from_secs(10), "the waiter parks", || {
        server
            .commands_since(&before)
            .get("evalsha")
            .copied()
            .unwrap_or(0)
            >= 2
    });
    parker
}

#[test]
fn a_run_that_new_waiters_continue_stays_within_the_tokens_set_aside() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(60))
        .max_local_handoffs(1)
        .build()
        .unwrap();
    // Every token Redis issues is the counter plus one: only what the
    // counter sets aside keeps in-memory hand-offs' tokens apart from them.
    let mut raw = server.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    redis::cmd("SET")
        .arg("redbaton:{continued}:fence")
        .arg(secs * 1_000_000 + micros + 86_400_000_000)
        .query::<()>(&mut raw)
        .unwrap();
    let lock = client.lock("continued").unwrap();
    let first = lock.lock().unwrap();
    let mut tokens = vec![first.fencing_token()];

    // A queue that empties while its last holder still holds: a parker
    // that gives up, and a waiter handed the lock in memory.
    let parker = spawn_parker(&server, &lock, Duration::from_millis(500));
    let queued = queue_behind(&client, &lock);
    first.unlock().unwrap();
    let (token, release) = queued.recv_timeout(Duration::from_secs(10)).unwrap();
    tokens.push(token);
    assert_eq!(parker.joined(), None, "the parker gave up");

    // A new queue behind the same ownership: its run starts afresh, but
    // the ownership has used the one token set aside for it.
    let parker = spawn_parker(&server, &lock, Duration::from_secs(20));
    let queued = queue_behind(&client, &lock);
    release.send(()).unwrap();
    let (token, release) = queued.recv_timeout(Duration::from_secs(10)).unwrap();
    tokens.push(token);
    release.send(()).unwrap();
    tokens.push(parker.joined().expect("the parker got it"));
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens in the order of the holds: {tokens:?}"
    );
}

/// A waiter that queues behind the parker of its client: sends its token
/// once it has the lock, with a sender that makes it release the lock.
fn queue_behind(client: &Client, lock: &Lock) -> mpsc::Receiver<(u64, mpsc::Sender<()>)> {
    let (got, told) = mpsc::channel();
    let (ready, queued) = mpsc::channel();
    let (client, lock) = (client.clone(), lock.clone());
    thread::spawn(move || {
        // Its identity first (a round trip it could be asleep in), so that
        // once it sleeps it sleeps in the local queue.
        let other = client.lock("queue-behind-warm-up").unwrap();
        other.lock().unwrap().unlock().unwrap();
        ready.send(thread_id()).unwrap();
        let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
        let (release, wait) = mpsc::channel();
        got.send((guard.fencing_token(), release)).unwrap();
        wait.recv_timeout(Duration::from_secs(20)).unwrap();
        guard.unlock().unwrap();
    });
    let tid = queued.recv_timeout(Duration::from_secs(10)).unwrap();
    eventually(Duration::from_secs(10), "the waiter queues", || {
        is_asleep(tid)
    });
    told
}

/// This file's child-process roles (run by the binary's `child_entry`);
/// false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    if role != "pass-forever" {
        return false;
    }
    let client = Client::builder(url)
        .default_lease(SIGKILL_LEASE)
        .build()
        .unwrap();
    let lock = client.lock("killed-run").unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (lock, url) = (lock.clone(), url.to_owned());
            thread::spawn(move || {
                let mut witness = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut rounds = 0u64;
                loop {
                    let guard = lock.lock().unwrap();
                    // Counted by the survivors, not here: this process dies.
                    let _ = inside(&mut witness, guard.fencing_token());
                    drop(guard);
                    rounds += 1;
                    if rounds == 50 {
                        println!("RUNNING");
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.joined();
    }
    true
}

/// The lease of the process killed in the middle of its run: renewed every
/// second, so that it outlives the occupancy marker of a hold cut short by
/// the kill (0.9 s) by more than a second.
const SIGKILL_LEASE: Duration = Duration::from_secs(3);

/// One critical section with an occupancy marker (`SET NX` with a 0.9 s
/// expiry, so that a killed holder's ends before its lock's lease does)
/// and a fenced store (`last_fence`): whether it was alone, and whether
/// its token was above every token stored before it.
fn inside(witness: &mut redis::Connection, token: u64) -> (bool, bool) {
    let alone: bool = redis::cmd("SET")
        .arg("occupant")
        .arg(std::process::id())
        .arg("NX")
        .arg("PX")
        .arg(900)
        .query::<Option<String>>(witness)
        .unwrap()
        .is_some();
    let last: u64 = redis::cmd("GET")
        .arg("last_fence")
        .query::<Option<u64>>(witness)
        .unwrap()
        .unwrap_or(0);
    redis::cmd("SET")
        .arg("last_fence")
        .arg(token.max(last))
        .query::<()>(witness)
        .unwrap();
    if alone {
        redis::cmd("DEL")
            .arg("occupant")
            .query::<()>(witness)
            .unwrap();
    }
    (alone, token > last)
}

/// A process whose four threads hand the lock on in memory is SIGKILLed in
/// the middle of its run, while this process's threads contend with it:
/// nobody is ever inside with another, every token is above the dead
/// process's, and the survivors get the lock within its lease.
#[test]
fn a_process_killed_in_the_middle_of_its_run_leaves_no_overlap_and_no_older_token() {
    let server = RedisServer::start();
    // Every token Redis issues is the counter plus one: what the victim's
    // ownerships set aside is all that keeps the survivors' tokens above
    // those it handed out in memory.
    let mut raw = server.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    redis::cmd("SET")
        .arg("redbaton:{killed-run}:fence")
        .arg(secs * 1_000_000 + micros + 86_400_000_000)
        .query::<()>(&mut raw)
        .unwrap();
    let mut victim = crate::support::spawn_child("pass-forever", &server);
    victim.wait_for_line("RUNNING", Duration::from_secs(30));
    let client = Client::builder(server.url())
        .default_lease(SIGKILL_LEASE)
        .build()
        .unwrap();
    let lock = client.lock("killed-run").unwrap();
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let survivors: Vec<_> = (0..4)
        .map(|_| {
            let (lock, url, killed) = (lock.clone(), server.url(), killed.clone());
            thread::spawn(move || {
                let mut witness = redis::Client::open(url).unwrap().get_connection().unwrap();
                let (mut overlaps, mut older, mut after_kill) = (0, 0, 0);
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while after_kill < 40 {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the survivors stalled"
                    );
                    let guard = lock.lock().unwrap();
                    let (alone, newer) = inside(&mut witness, guard.fencing_token());
                    overlaps += u64::from(!alone);
                    older += u64::from(!newer);
                    drop(guard);
                    if killed.load(std::sync::atomic::Ordering::SeqCst) {
                        after_kill += 1;
                    }
                }
                (overlaps, older)
            })
        })
        .collect();
    // Both processes take turns for a while, then the victim dies.
    thread::sleep(Duration::from_millis(300));
    victim.kill();
    let killed_at = std::time::Instant::now();
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut overlaps, mut older) = (0, 0);
    for survivor in survivors {
        let (o, r) = survivor.joined();
        overlaps += o;
        older += r;
    }
    let took = killed_at.elapsed();
    println!("survivors done {took:?} after the kill");
    assert_eq!(overlaps, 0, "two holders inside at once");
    assert_eq!(older, 0, "a token not above every token before it");
    assert!(
        took < SIGKILL_LEASE + Duration::from_secs(5),
        "the survivors took {took:?} after the kill"
    );
}

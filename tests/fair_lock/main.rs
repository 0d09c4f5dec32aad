//! The fair lock: acquisitions across processes in arrival order, a
//! release waking exactly the next waiter, dead or impatient waiters never
//! blocking the queue, crashed holders, what waiting costs, bad input.
//! Child processes re-run this binary on `child_entry`.

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redbaton::{Client, Error};
use testkit::RedisServer;

use crate::support::{spawn_child, JoinWithin};

#[cfg(feature = "cluster")]
mod cluster;
mod events;
mod grants;
mod order;

const THREADS_PER_CHILD: usize = 4;
const ROUNDS_PER_THREAD: usize = 10;
/// How much later a request may be served before an earlier one: its first
/// look at the lock, before it takes its place, plus scheduling noise on a
/// loaded machine.
const ORDER_SLACK_US: u128 = 50_000;

/// Microseconds since the epoch: one clock for every process of the test.
fn epoch_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The queue of the fair lock `name` in Redis.
fn queue_key(name: &str) -> String {
    format!("redbaton:{{{name}}}:fair:lock:queue")
}

/// The waiters in the queue of the fair lock `name`, with their arrivals
/// (server µs), first first.
fn arrivals(con: &mut redis::Connection, name: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(queue_key(name))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(con)
        .unwrap()
}

/// When each place in the queue of the fair lock `name` ends unless its
/// waiter comes back (server ms).
fn place_ends(server: &RedisServer, name: &str) -> BTreeMap<String, f64> {
    redis::cmd("ZRANGE")
        .arg(format!("redbaton:{{{name}}}:fair:lock:places"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut server.connection())
        .unwrap()
}

fn queue_len(server: &RedisServer, name: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(queue_key(name))
        .query(&mut server.connection())
        .unwrap()
}

/// How many wait in the queue of the fair lock `name` on `deployment`.
fn queue_of(deployment: &support::Deployment, name: &str) -> u64 {
    queue_len(deployment.server_for(&queue_key(name)), name)
}

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[|role, url| {
        match role {
            "fair_worker" => fair_worker(url),
            "fair_waiter" => fair_waiter(url),
            "fair_holder" => fair_holder(url),
            "fair_run" => fair_run(url),
            "fair_granted" => grants::granted_waiter(url),
            _ => return false,
        }
        true
    }]);
}

/// Threads take the fair lock in turns; each records, on the data server,
/// when it asked (before its request) and checks an occupancy marker.
fn fair_worker(url: &str) {
    let client = Client::builder(url)
        .max_park(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut control = redis::Client::open(url).unwrap().get_connection().unwrap();
    println!("READY");
    let _: (String, String) = redis::cmd("BLPOP")
        .arg("go")
        .arg(30)
        .query(&mut control)
        .unwrap();
    let workers: Vec<_> = (0..THREADS_PER_CHILD)
        .map(|_| {
            let lock = client.fair_lock("turns").unwrap();
            let url = url.to_owned();
            thread::spawn(move || {
                let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut overlaps = 0;
                for _ in 0..ROUNDS_PER_THREAD {
                    let asked = epoch_us();
                    let guard = lock
                        .try_lock_for(Duration::from_secs(60))
                        .unwrap()
                        .expect("acquired within a minute");
                    let entered: bool = redis::cmd("SET")
                        .arg("occupant")
                        .arg(1)
                        .arg("NX")
                        .query(&mut raw)
                        .unwrap();
                    if !entered {
                        overlaps += 1;
                    }
                    redis::cmd("RPUSH")
                        .arg("served")
                        .arg(asked.to_string())
                        .query::<()>(&mut raw)
                        .unwrap();
                    // Long enough that a barging request would overtake
                    // waiters by far more than the slack.
                    thread::sleep(Duration::from_millis(10));
                    redis::cmd("DEL")
                        .arg("occupant")
                        .query::<()>(&mut raw)
                        .unwrap();
                    guard.unlock().unwrap();
                }
                overlaps
            })
        })
        .collect();
    let overlaps: usize = workers.into_iter().map(JoinWithin::joined).sum();
    println!("RESULT {overlaps}");
}

/// Waits for the fair lock "queue" (a place in its queue), saying so.
fn fair_waiter(url: &str) {
    let client = Client::builder(url)
        .max_park(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.fair_lock("queue").unwrap();
    println!("WAITING");
    let got = lock.try_lock_for(Duration::from_secs(60)).unwrap();
    println!("GOT {}", got.is_some());
}

/// Takes the fair lock "crashed" with a fixed 1 s lease and says so.
fn fair_holder(url: &str) {
    let client = Client::open(url).unwrap();
    let guard = client
        .fair_lock("crashed")
        .unwrap()
        .with_fixed_lease(Duration::from_secs(1))
        .unwrap()
        .lock()
        .unwrap();
    println!("HOLDING {}", epoch_us());
    thread::sleep(Duration::from_secs(60));
    drop(guard);
}

/// Two threads queue in turn for the fair lock "run" (held by the
/// parent), under a renewed 1 s lease: the first, served, passes the lock
/// in memory to the second as it releases, which then holds it until this
/// process is killed.
fn fair_run(url: &str) {
    let client = Client::builder(url)
        .max_park(Duration::from_millis(200))
        .default_lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    let threads: Vec<_> = ["FIRST", "HOLDING"]
        .into_iter()
        .enumerate()
        .map(|(i, said)| {
            let lock = client.fair_lock("run").unwrap();
            let thread = thread::spawn(move || {
                let guard = lock.lock().unwrap();
                println!("{said} {}", guard.fencing_token());
                if said == "HOLDING" {
                    thread::sleep(Duration::from_secs(60));
                }
                drop(guard);
            });
            while redis::cmd("ZCARD")
                .arg(queue_key("run"))
                .query::<u64>(&mut raw)
                .unwrap()
                < i as u64 + 1
            {
                thread::sleep(Duration::from_millis(5));
            }
            thread
        })
        .collect();
    println!("QUEUED");
    for thread in threads {
        thread.joined();
    }
}

/// A process killed (SIGKILL) while a thread of it holds the fair lock
/// passed in memory: another process's waiter, queued behind the run, gets
/// the lock once the lease of the ownership Redis knows ends (renewals
/// stopped with the process) and the places the run served end, never
/// before the kill, and under a fencing token above every one the dead
/// process held.
#[test]
fn a_process_killed_while_its_run_holds_the_lock_gives_it_up_in_token_order() {
    let server = RedisServer::start();
    // A waiter finds the end of a holder that died at its next look (a
    // park lasts at most `max_park`): nothing else announces it.
    let other = Client::builder(server.url())
        .max_park(Duration::from_millis(300))
        .build()
        .unwrap();
    let first = other.fair_lock("run").unwrap().lock().unwrap();
    let mut child = spawn_child("fair_run", &server);
    child.wait_for_line("QUEUED", Duration::from_secs(30));
    let token = |line: String| -> u64 { line.trim().parse().unwrap() };
    let (served, remote) = mpsc::channel();
    let waiter = {
        let lock = other.fair_lock("run").unwrap();
        thread::spawn(move || {
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .unwrap()
                .expect("served");
            served
                .send((Instant::now(), guard.fencing_token()))
                .unwrap();
        })
    };
    support::eventually(Duration::from_secs(10), "the remote waiter's place", || {
        queue_len(&server, "run") == 3
    });
    first.unlock().unwrap();
    let first_token = token(child.wait_for_line("FIRST", Duration::from_secs(10)));
    let holding = token(child.wait_for_line("HOLDING", Duration::from_secs(10)));
    assert_eq!(holding, first_token + 1, "passed in memory");
    // The watchdog renews the lease for the thread it was passed to: three
    // renewals (a lease and more) while it holds it.
    let pttl = || -> i64 {
        redis::cmd("PTTL")
            .arg("redbaton:{run}:fair:lock")
            .query(&mut server.connection())
            .unwrap()
    };
    for _ in 0..3 {
        let mut last = pttl();
        support::eventually(Duration::from_secs(3), "a renewal", || {
            let now = pttl();
            let renewed = now > last;
            last = now;
            renewed
        });
    }
    assert!(
        remote.try_recv().is_err(),
        "served while the run holds the lock"
    );
    let killed = Instant::now();
    child.kill();
    let (at, remote_token) = remote.recv_timeout(Duration::from_secs(15)).unwrap();
    waiter.joined();
    assert!(at > killed);
    assert!(remote_token > holding, "{remote_token} after {holding}");
    // The lease (1 s) and the served place (1.5 x 200 ms + 500 ms) ended,
    // then the waiter looked (within 300 ms).
    assert!(
        at - killed < Duration::from_secs(5),
        "served {:?} after the kill",
        at - killed
    );
    assert_eq!(queue_len(&server, "run"), 0);
}

#[test]
fn three_processes_are_served_in_arrival_order_one_at_a_time() {
    let server = RedisServer::start();
    let mut children: Vec<_> = (0..3)
        .map(|_| spawn_child("fair_worker", &server))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    let mut raw = server.connection();
    redis::cmd("RPUSH")
        .arg("go")
        .arg(&["1", "2", "3"][..])
        .query::<()>(&mut raw)
        .unwrap();
    for child in &mut children {
        let result = child.wait_for_line("RESULT", Duration::from_secs(120));
        assert_eq!(result.trim(), "0", "no two holders at once");
    }
    let served: Vec<u128> = redis::cmd("LRANGE")
        .arg("served")
        .arg(0)
        .arg(-1)
        .query::<Vec<String>>(&mut raw)
        .unwrap()
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(served.len(), 3 * THREADS_PER_CHILD * ROUNDS_PER_THREAD);
    // Served in the order asked: no request is served before one that
    // asked earlier (by more than the slack of its first look).
    let mut latest = 0;
    let mut worst = 0;
    for (i, asked) in served.iter().enumerate() {
        if *asked + ORDER_SLACK_US < latest {
            panic!(
                "acquisition {i} asked at {asked} µs, {} µs before one served earlier",
                latest - asked
            );
        }
        worst = worst.max(latest.saturating_sub(*asked));
        latest = latest.max(*asked);
    }
    println!("worst inversion: {worst} µs");
    assert_eq!(queue_len(&server, "turns"), 0, "nobody left in the queue");
}

across_topologies! {
    but_masters;
    /// Waiters are served in the order they arrived, each by a release that
    /// wakes exactly it: the waiters park for far longer than the test, so
    /// only their own wake-up can get them the lock.
    fn a_release_wakes_exactly_the_next_waiter_in_arrival_order(deployment) {
        let client = deployment.builder().max_park(Duration::from_secs(30)).build().unwrap();
        let lock = client.fair_lock("line").unwrap();
        let held = lock.lock().unwrap();
        let (tx, rx) = mpsc::channel();
        let inside = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..5)
            .map(|i| {
                let (lock, tx, inside) = (lock.clone(), tx.clone(), Arc::clone(&inside));
                let waiter = thread::spawn(move || {
                    let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().expect("served");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tx.send(i).unwrap();
                    thread::sleep(Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().unwrap();
                });
                // Each takes its place before the next starts.
                support::eventually(Duration::from_secs(10), "the waiter's place", || {
                    queue_of(deployment, "line") == i as u64 + 1
                });
                waiter
            })
            .collect();
        let released = Instant::now();
        held.unlock().unwrap();
        let order: Vec<i32> = (0..5).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        for waiter in waiters {
            waiter.joined();
        }
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
        // Five hand-overs of 20 ms each, woken at once: far below one park.
        assert!(released.elapsed() < Duration::from_secs(5), "{:?}", released.elapsed());
    }
}

/// The fair lock's hand-off inside a process (speed issue, item 1), by
/// script: when the next waiter in arrival order is a parked thread of the
/// releasing client, the release wakes it in memory, with no token pushed
/// (no wake script, no `RPUSH`, no look of the parking hub), and arrival
/// order holds. Under a fixed lease (which never passes in memory), each
/// release's script hands the lock to that waiter (`fair/handoff.lua`),
/// which wakes holding it: one script per hand-off, with a fencing token
/// above the last.
#[test]
fn a_release_hands_the_lock_to_the_next_parked_thread_of_the_same_client_in_its_script() {
    let (tokens, during) = hand_offs_inside_one_client("inside", SCRIPTED);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    // The holder's release, the first waiter's attempt, four hand-offs,
    // the last waiter's release. Each waiter's attempt and release instead
    // of the hand-offs would make eleven.
    assert_eq!(support::scripts_run(&during), 7, "{during:?}");
}

/// The fair lock's hand-off inside a process in memory (speed issue, item
/// 1): an ownership taken afresh while threads of its client wait next in
/// the queue passes along them in their arrival order with no command at
/// all, each under the next fencing token; the last of them releases in
/// Redis, dropping the places of those served, and the next acquisition's
/// token is above all of theirs.
#[test]
fn a_release_passes_the_lock_in_memory_along_the_threads_of_its_client_next_in_the_queue() {
    let (tokens, during) = hand_offs_inside_one_client("along", None);
    // The first waiter took the lock in Redis; the others, in memory,
    // each one token above the one before.
    assert!(tokens[0] < tokens[1], "{tokens:?}");
    assert!(
        tokens[1..].windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{tokens:?}"
    );
    // The holder's release, the first waiter's attempt, the last waiter's
    // release; without passing in memory, seven (see above).
    assert_eq!(support::scripts_run(&during), 3, "{during:?}");
}

/// Five threads of one client queue behind its holder, which took the
/// fair lock `name` (under `fixed_lease`, if any) before anyone queued,
/// so that its release wakes the first waiter, which takes the lock in an
/// attempt; each then releases to the next. Checks that they are served
/// in arrival order, with no token pushed, the queue empty at the end,
/// and a fresh acquisition's token above theirs; returns the first token
/// and the waiters' tokens, and the commands from the holder's release on.
fn hand_offs_inside_one_client(
    name: &'static str,
    fixed_lease: Option<Duration>,
) -> (Vec<u64>, BTreeMap<String, u64>) {
    const WAITERS: u64 = 5;
    let server = RedisServer::start();
    let client = patient(&server);
    let lock = client.fair_lock(name).unwrap();
    let lock = match fixed_lease {
        Some(lease) => lock.with_fixed_lease(lease).unwrap(),
        None => lock,
    };
    let held = lock.lock().unwrap();
    let mut tokens = vec![held.fencing_token()];
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (lock, tx) = (lock.clone(), tx.clone());
            let waiter = thread::spawn(move || {
                let guard = lock
                    .try_lock_for(Duration::from_secs(20))
                    .unwrap()
                    .expect("served");
                tx.send((i, guard.fencing_token())).unwrap();
                guard.unlock().unwrap();
            });
            support::eventually(Duration::from_secs(10), "the waiter's place", || {
                queue_len(&server, name) == i + 1
            });
            waiter
        })
        .collect();
    // Every waiter parked: its own list registered with the server.
    support::eventually(Duration::from_secs(10), "every waiter parked", || {
        support::parked(&server) == WAITERS
    });
    let before = server.command_calls();
    held.unlock().unwrap();
    let served: Vec<(u64, u64)> = (0..WAITERS)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("served"))
        .collect();
    for waiter in waiters {
        waiter.joined();
    }
    let during = server.commands_since(&before);
    let order: Vec<u64> = served.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, [0, 1, 2, 3, 4]);
    tokens.extend(served.iter().map(|&(_, token)| token));
    assert_eq!(
        during.get("rpush").copied().unwrap_or(0),
        0,
        "a token was pushed: {during:?}"
    );
    assert_eq!(queue_len(&server, name), 0);
    let next = lock.lock().unwrap().fencing_token();
    assert!(
        tokens.iter().all(|&token| token < next),
        "{next} after {tokens:?}"
    );
    (tokens, during)
}

/// A run in memory follows the queue's order across processes: it stops
/// at a waiter of another client that arrived before the next thread of
/// its own. The holder's acquisition finds a thread of its client next,
/// then another client's waiter, then a second thread of its client: the
/// first thread is passed the lock in memory (the next token), and its
/// release wakes the other client's waiter before the second thread.
#[test]
fn a_run_in_memory_stops_at_a_waiter_of_another_client_that_arrived_before_the_next_thread() {
    let server = RedisServer::start();
    let (client, other) = (patient(&server), patient(&server));
    let first = other.fair_lock("interleaved").unwrap().lock().unwrap();
    let waiters = [
        ("holder", &client),
        ("local", &client),
        ("remote", &other),
        ("later", &client),
    ];
    let (waiters, order, go) = parked_in_turn(&server, "interleaved", &waiters, None);
    first.unlock().unwrap();
    let released = Instant::now();
    let holder = order.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(holder.0, "holder");
    renewed_past_grant(&server, "interleaved");
    let before = server.command_calls();
    go.send(()).unwrap();
    let rest: Vec<(&str, u64)> = (0..3)
        .map(|_| order.recv_timeout(Duration::from_secs(15)).expect("served"))
        .collect();
    let took = released.elapsed();
    for waiter in waiters {
        waiter.joined();
    }
    let during = server.commands_since(&before);
    let who: Vec<&str> = rest.iter().map(|&(who, _)| who).collect();
    assert_eq!(who, ["local", "remote", "later"]);
    // The local thread's release (the run's last) grants the lock to the
    // remote waiter, knowing it from the line's `after`, and the remote
    // waiter's release grants it to the later thread: three releases, two
    // grants (their `HSET`s and places the only writes of a hash or a
    // place: no attempt), no second call to wake anyone. A granted hold's
    // first renewal is due at once, and may come before its release (or
    // just after it, finding it gone): up to one more script each.
    let scripts = support::scripts_run(&during);
    assert!((3..=5).contains(&scripts), "{during:?}");
    assert_eq!(during.get("publish"), Some(&2), "{during:?}");
    assert_eq!(during.get("hset"), Some(&2), "{during:?}");
    assert_eq!(during.get("zadd"), Some(&2), "{during:?}");
    assert_eq!(during.get("rpush"), None, "{during:?}");
    assert_eq!(rest[0].1, holder.1 + 1, "passed in memory: {rest:?}");
    assert!(rest[1].1 > rest[0].1 && rest[2].1 > rest[1].1, "{rest:?}");
    assert!(took < Duration::from_secs(5), "all served after {took:?}");
    assert_eq!(queue_len(&server, "interleaved"), 0);
}

/// A thread served by a run in memory that asks again while the run goes
/// on arrives anew, behind those that arrived meanwhile: the place it was
/// served for (still in the queue, unknown to Redis as served) neither
/// puts it first again nor, dropped by the run's last release, takes its
/// new place with it.
#[test]
fn a_thread_served_in_memory_that_asks_again_queues_behind_later_arrivals() {
    const NAME: &str = "again";
    let server = RedisServer::start();
    let (client, other) = (patient(&server), patient(&server));
    let first = other.fair_lock(NAME).unwrap().lock().unwrap();
    let (holder_go, holder_may_go) = mpsc::channel::<()>();
    let (second_go, second_may_go) = mpsc::channel::<()>();
    let asks_again: AfterUnlock = |lock, unlocked, served| {
        unlocked.expect("unlocked");
        let wait = Duration::from_secs(25);
        let guard = lock.try_lock_for(wait).unwrap().expect("served again");
        served.send(("first again", guard.fencing_token())).unwrap();
        guard.unlock().unwrap();
    };
    let waiters = vec![
        InTurnWaiter {
            who: "holder",
            client: &client,
            gate: Some(holder_may_go),
            then: unlocked,
            reenters: false,
        },
        InTurnWaiter {
            who: "first",
            client: &client,
            gate: None,
            then: asks_again,
            reenters: false,
        },
        InTurnWaiter {
            who: "second",
            client: &client,
            gate: Some(second_may_go),
            then: unlocked,
            reenters: false,
        },
        InTurnWaiter {
            who: "remote",
            client: &other,
            gate: None,
            then: unlocked,
            reenters: false,
        },
    ];
    let (threads, order) = queued_in_turn(&server, NAME, waiters, None);
    let next = || {
        order
            .recv_timeout(Duration::from_secs(15))
            .map(|(who, _)| who)
    };
    first.unlock().unwrap();
    assert_eq!(next(), Ok("holder"));
    let places = place_ends(&server, NAME);
    let released = Instant::now();
    holder_go.send(()).unwrap();
    assert_eq!(next(), Ok("first"));
    assert_eq!(next(), Ok("second"));
    // The first asked again while the second holds the lock: its attempt
    // renewed its place (nobody else's: the others hold or are parked for
    // 30 s).
    let mut asked_again = None;
    support::eventually(Duration::from_secs(10), "the first asked again", || {
        asked_again = place_ends(&server, NAME)
            .into_iter()
            .find(|(waiter, end)| places.get(waiter).is_some_and(|before| end > before))
            .map(|(waiter, _)| waiter);
        asked_again.is_some()
    });
    // It arrived anew: last in the queue, behind the remote waiter and the
    // places of the holder (granted the lock by `first`'s release) and the
    // second, which the run's last release drops; the place it was served
    // for, still first until then, did not make it the head.
    let queue = arrivals(&mut server.connection(), NAME);
    assert_eq!(queue.len(), 4, "{queue:?}");
    assert_eq!(
        queue.last().map(|(waiter, _)| waiter),
        asked_again.as_ref(),
        "{queue:?}"
    );
    let recorded_head: Option<String> = redis::cmd("HGET")
        .arg(format!("redbaton:{{{NAME}}}:fair:lock"))
        .arg("next")
        .query(&mut server.connection())
        .unwrap();
    assert_ne!(recorded_head, asked_again, "recorded as the head");
    second_go.send(()).unwrap();
    let rest: Vec<&str> = (0..2).map(|_| next().expect("served")).collect();
    let took = released.elapsed();
    for thread in threads {
        thread.joined();
    }
    assert_eq!(rest, ["remote", "first again"]);
    assert!(took < Duration::from_secs(5), "all served after {took:?}");
    assert_eq!(queue_len(&server, NAME), 0);
}

/// A parked thread of the releasing client that the holder's acquisition
/// found next in line, but that is no longer the head of the queue
/// (another client's waiter came back to an earlier place), is not handed
/// the lock: the hand-off's script changes nothing, and the release frees
/// the lock for the head as usual. Arrival order holds.
#[test]
fn a_thread_of_the_same_client_that_is_no_longer_the_head_is_not_handed_the_lock() {
    let server = RedisServer::start();
    let (client, other) = (patient(&server), patient(&server));
    let first = other.fair_lock("passed-over").unwrap().lock().unwrap();
    // The holder (of `client`), then a waiter of `client`, then one of
    // `other`.
    let waiters = [("holder", &client), ("local", &client), ("remote", &other)];
    let (waiters, order, go) = parked_in_turn(&server, "passed-over", &waiters, SCRIPTED);
    first.unlock().unwrap();
    let (who, _) = order.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(who, "holder");
    // The remote waiter takes an earlier place than the local one.
    move_second_first(&server, "passed-over");
    let released = Instant::now();
    go.send(()).unwrap();
    let rest: Vec<&str> = (0..2)
        .map(|_| {
            order
                .recv_timeout(Duration::from_secs(15))
                .expect("served")
                .0
        })
        .collect();
    let took = released.elapsed();
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(rest, ["remote", "local"]);
    assert!(took < Duration::from_secs(5), "both served after {took:?}");
    assert_eq!(queue_len(&server, "passed-over"), 0);
}

/// Sixteen threads of one client take the fair lock in turn as fast as
/// they can: runs in memory, each thread asking again at once, never leave
/// a thread waiting out a park (10 s here) for a wake-up that does not
/// come, and no thread takes it twice in a row while others wait.
#[test]
fn threads_of_one_client_taking_the_fair_lock_in_turn_never_wait_out_a_park() {
    const THREADS: usize = 16;
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = client.fair_lock("turns").unwrap();
    let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let (lock, taken, start) = (lock.clone(), Arc::clone(&taken), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let end = Instant::now() + Duration::from_secs(1);
                let mut longest = Duration::ZERO;
                while Instant::now() < end {
                    let asked = Instant::now();
                    let guard = lock.lock().unwrap();
                    longest = longest.max(asked.elapsed());
                    taken.lock().unwrap().push((guard.fencing_token(), i));
                    guard.unlock().unwrap();
                }
                longest
            })
        })
        .collect();
    let longest = threads
        .into_iter()
        .map(|thread| thread.joined())
        .max()
        .unwrap();
    assert!(
        longest < Duration::from_secs(3),
        "a thread waited {longest:?}"
    );
    let mut taken = taken.lock().unwrap().clone();
    assert!(taken.len() > 100, "{} acquisitions", taken.len());
    // In token order (the order they held it): no token twice, and hardly
    // ever one thread twice in a row, which arrival order allows only when
    // it asked again before every other thread (all of them between their
    // release and their next place), and at the very end, when the others
    // may have stopped asking. A lock that let the releasing thread barge
    // would give it most turns.
    taken.sort_unstable();
    let tokens: Vec<u64> = taken.iter().map(|&(token, _)| token).collect();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "a token twice"
    );
    let body = &taken[..taken.len() - THREADS];
    let again = body
        .windows(2)
        .filter(|pair| pair[0].1 == pair[1].1)
        .count();
    assert!(
        again * 100 <= body.len(),
        "the same thread twice in a row {again} times in {}",
        body.len()
    );
}

/// The thread that took an ownership in Redis and passed it on in memory
/// does not take it back while the thread it passed it to holds it: the
/// lock under its identity in Redis is that thread's, not a leftover of
/// its own (`fair/acquire.lua`'s ARGV[13]).
#[test]
fn the_thread_that_took_a_run_in_redis_does_not_take_it_back_while_another_holds_it() {
    const NAME: &str = "lent";
    let server = RedisServer::start();
    let (client, other) = (patient(&server), Client::open(&server.url()).unwrap());
    let first = other.fair_lock(NAME).unwrap().lock().unwrap();
    let (holder_go, holder_may_go) = mpsc::channel::<()>();
    let (waiter_go, waiter_may_go) = mpsc::channel::<()>();
    // Says 1 when it took the lock again, else 0.
    let tries_again: AfterUnlock = |lock, unlocked, served| {
        unlocked.expect("unlocked");
        let again = lock.try_lock().unwrap();
        served
            .send(("holder again", u64::from(again.is_some())))
            .unwrap();
    };
    let waiters = vec![
        InTurnWaiter {
            who: "holder",
            client: &client,
            gate: Some(holder_may_go),
            then: tries_again,
            reenters: false,
        },
        InTurnWaiter {
            who: "waiter",
            client: &client,
            gate: Some(waiter_may_go),
            then: unlocked,
            reenters: false,
        },
    ];
    let (threads, order) = queued_in_turn(&server, NAME, waiters, None);
    let next = || order.recv_timeout(Duration::from_secs(10)).unwrap();
    first.unlock().unwrap();
    let holder = next();
    assert_eq!(holder.0, "holder");
    holder_go.send(()).unwrap();
    assert_eq!(next(), ("waiter", holder.1 + 1), "passed in memory");
    assert_eq!(
        next(),
        ("holder again", 0),
        "taken while the waiter holds it"
    );
    waiter_go.send(()).unwrap();
    for thread in threads {
        thread.joined();
    }
    assert_eq!(client.fair_lock(NAME).unwrap().holder().unwrap(), None);
}

/// The last release of a run (`fair/release.lua`, run here as the client
/// sends it) drops the places of the waiters it served that still have the
/// arrivals they were served for, and keeps a served waiter's new place
/// (it asked again, and arrived anew); it then wakes the head behind them.
#[test]
fn a_runs_last_release_drops_only_the_places_it_served() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let name = "served";
    let lock = format!("redbaton:{{{name}}}:fair:lock");
    let (queue, places) = (queue_key(name), format!("{lock}:places"));
    // c:2 and c:3 were served in memory; c:3 asked again since.
    held_by_c1(&mut con, name, &[("c:2", 100), ("r:9", 200), ("c:3", 300)]);
    let reply: (i64, String, i64) = release_script()
        .key(&lock)
        .key(&queue)
        .key(&places)
        .arg(&["c:1", "10", "0", "30000", "60000", "", "", ""])
        .arg(&["c:2", "100", "c:3", "50"])
        .invoke(&mut con)
        .unwrap();
    assert_eq!(reply, (0, "r:9".to_owned(), 0));
    let left: Vec<String> = redis::cmd("ZRANGE")
        .arg(&queue)
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert_eq!(left, ["r:9", "c:3"]);
    let left: Vec<String> = redis::cmd("ZRANGE")
        .arg(&places)
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert_eq!(left, ["c:3", "r:9"]);
}

/// The fair lock `name` held by `c:1` under token 10, asked for, with
/// `queued` (waiter, arrival) in its queue, their places far off.
fn held_by_c1(con: &mut redis::Connection, name: &str, queued: &[(&str, u64)]) {
    let lock = format!("redbaton:{{{name}}}:fair:lock");
    let mut pipe = redis::pipe();
    pipe.cmd("HSET")
        .arg(&lock)
        .arg(&["flag", "c:1", "count", "1", "fence", "10", "waited", "1"])
        .cmd("PEXPIRE")
        .arg(&lock)
        .arg(30_000);
    for &(waiter, arrival) in queued {
        pipe.cmd("ZADD")
            .arg(queue_key(name))
            .arg(arrival)
            .arg(waiter)
            .cmd("ZADD")
            .arg(format!("{lock}:places"))
            .arg(u64::MAX >> 12)
            .arg(waiter);
    }
    pipe.query::<()>(con).unwrap();
}

/// `fair/release.lua` as the client sends it, with its libraries.
fn release_script() -> redis::Script {
    redis::Script::new(concat!(
        include_str!("../../src/scripts/lib/lease.lua"),
        include_str!("../../src/scripts/lib/fair_queue.lua"),
        include_str!("../../src/scripts/lib/baton.lua"),
        include_str!("../../src/scripts/lib/next_fence.lua"),
        include_str!("../../src/scripts/lib/grant_message.lua"),
        include_str!("../../src/scripts/lib/grant.lua"),
        include_str!("../../src/scripts/fair/release.lua")
    ))
}

/// The threads [`parked_in_turn`] started, the receiver they say their
/// name and fencing token on once served, and the sender that lets the
/// first unlock.
type InTurn = (
    Vec<thread::JoinHandle<()>>,
    mpsc::Receiver<(&'static str, u64)>,
    mpsc::Sender<()>,
);

/// A fixed lease for the hand-off tests: an ownership under a fixed lease
/// never passes in memory, so a release hands it to a parked thread of
/// its client by the hand-off script (`fair/handoff.lua`).
const SCRIPTED: Option<Duration> = Some(Duration::from_secs(30));

/// Threads of `waiters`' clients, each named, ask for the fair lock `name`
/// on `server` in turn (under `fixed_lease`, if any), each parked before
/// the next asks. Each says its name and fencing token on the receiver
/// once served, then unlocks: the first only once told on the sender.
fn parked_in_turn(
    server: &RedisServer,
    name: &'static str,
    waiters: &[(&'static str, &Client)],
    fixed_lease: Option<Duration>,
) -> InTurn {
    let (go, first_may_go) = mpsc::channel::<()>();
    let mut first_may_go = Some(first_may_go);
    let waiters = waiters
        .iter()
        .map(|&(who, client)| InTurnWaiter {
            who,
            client,
            gate: first_may_go.take(),
            then: unlocked,
            reenters: false,
        })
        .collect();
    let (threads, order) = queued_in_turn(server, name, waiters, fixed_lease);
    (threads, order, go)
}

/// A thread of [`queued_in_turn`].
struct InTurnWaiter<'a> {
    who: &'static str,
    client: &'a Client,
    /// Told when it may unlock (`None`: at once).
    gate: Option<mpsc::Receiver<()>>,
    /// What it does next, with its lock, told how its unlock went: it may
    /// say more on the sender.
    then: AfterUnlock,
    /// Whether it takes the lock again once served, and unlocks the first
    /// level before it says so: the level left, a re-entry's guard, is
    /// released last.
    reenters: bool,
}

/// What a thread of [`queued_in_turn`] does once it has unlocked.
type AfterUnlock = fn(&redbaton::Lock, Result<(), Error>, &mpsc::Sender<(&'static str, u64)>);

/// The usual [`AfterUnlock`]: the unlock succeeded, and that is all.
fn unlocked(_: &redbaton::Lock, unlocked: Result<(), Error>, _: &mpsc::Sender<(&str, u64)>) {
    unlocked.expect("unlocked");
}

/// Threads of `waiters` ask for the fair lock `name` on `server` in turn
/// (under `fixed_lease`, if any), each parked before the next asks. Each
/// says its name and fencing token on the receiver once served, waits for
/// its gate, unlocks and does what it does then.
fn queued_in_turn(
    server: &RedisServer,
    name: &'static str,
    waiters: Vec<InTurnWaiter<'_>>,
    fixed_lease: Option<Duration>,
) -> (
    Vec<thread::JoinHandle<()>>,
    mpsc::Receiver<(&'static str, u64)>,
) {
    let (served, order) = mpsc::channel();
    let threads = waiters
        .into_iter()
        .enumerate()
        .map(|(i, waiter)| {
            let lock = waiter.client.fair_lock(name).unwrap();
            let lock = match fixed_lease {
                Some(lease) => lock.with_fixed_lease(lease).unwrap(),
                None => lock,
            };
            let served = served.clone();
            let InTurnWaiter {
                who,
                gate,
                then,
                reenters,
                ..
            } = waiter;
            let thread = thread::spawn(move || {
                let mut guard = lock
                    .try_lock_for(Duration::from_secs(25))
                    .unwrap()
                    .expect("served");
                let token = guard.fencing_token();
                if reenters {
                    let inner = lock.lock().expect("re-entered");
                    guard.unlock().expect("the first level released");
                    guard = inner;
                }
                served.send((who, token)).unwrap();
                if let Some(gate) = gate {
                    gate.recv().unwrap();
                }
                then(&lock, guard.unlock(), &served);
            });
            support::eventually(Duration::from_secs(10), "the waiter parked", || {
                queue_len(server, name) == i as u64 + 1 && support::parked(server) == i as u64 + 1
            });
            thread
        })
        .collect();
    (threads, order)
}

/// A client of `server` whose waiters park for up to 30 s: a waiter
/// served within a few seconds was woken, not timed out of its park.
fn patient(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Waits until the hold of the fair lock `name` lives longer than a
/// grant's lease (2 s): a granted guard's first renewal is due at once,
/// and a test that counts the commands of what follows starts after it.
/// (A hold its own attempt took lives its whole lease from the start.)
fn renewed_past_grant(server: &RedisServer, name: &str) {
    let key = format!("redbaton:{{{name}}}:fair:lock");
    let mut con = server.connection();
    support::eventually(Duration::from_secs(10), "the hold renewed", || {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
        pttl > 2_000
    });
}

/// A release whose next waiter is another client's thread parked as the
/// head of the queue, one it may not grant the lock to, pushes a token to
/// the head's list itself (no second call to wake it), and the waiter,
/// woken by its parking hub at the
/// list's announcement, pops it in its own attempt: no look (`LLEN` +
/// `LPOP`) comes between.
#[test]
fn another_clients_waiter_takes_its_token_in_its_attempt_without_a_look() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let waiting = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let held = holder.fair_lock("across").unwrap().lock().unwrap();
    // A fixed lease longer than a grant's: the release wakes the waiter
    // instead of granting it the lock (see `grants.rs` for the grant).
    let lock = waiting
        .fair_lock("across")
        .unwrap()
        .with_fixed_lease(Duration::from_secs(30))
        .unwrap();
    let wait = move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(20))
            .unwrap()
            .expect("served");
        guard.unlock().unwrap();
    };
    let during = support::hand_off_commands(&server, wait, || held.unlock().unwrap());
    // The release (which pushes one token), the waiter's attempt (which
    // pops it) and its release: three scripts.
    assert_eq!(support::scripts_run(&during), 3, "{during:?}");
    assert_eq!(during.get("llen"), None, "{during:?}");
    assert_eq!(during.get("lpop"), Some(&1), "{during:?}");
    assert_eq!(during.get("rpush"), Some(&1), "{during:?}");
    assert_eq!(queue_len(&server, "across"), 0);
}

/// Steady contention: a waiter that became the head while it was parked
/// (behind another client's waiter that went first) never found itself
/// the head behind a holder, so it parks on its own list. The release of
/// the waiter that went first pushes that list itself (its acquisition
/// found that waiter next in line): no second call to wake it. (Its
/// clients are refused the grant channel: else the release grants it the
/// lock, see `grants`.)
#[test]
fn a_waiter_that_became_the_head_while_parked_is_woken_by_the_release_itself() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.fair_lock("steady").unwrap().lock().unwrap();
    let (go, first_may_go) = mpsc::channel();
    let ungranted = testkit::ungranted_user(&mut server.connection(), &server.url());
    let (waiters, order) = two_parked_waiters(&server, "steady", &ungranted, Some(first_may_go));
    held.unlock().unwrap();
    assert_eq!(order.recv_timeout(Duration::from_secs(20)), Ok("first"));
    let before = server.command_calls();
    go.send(()).unwrap();
    assert_eq!(order.recv_timeout(Duration::from_secs(20)), Ok("second"));
    for waiter in waiters {
        waiter.joined();
    }
    let during = server.commands_since(&before);
    // The first waiter's release (which pushes the second's list), the
    // second's attempt (which pops it) and its release: three scripts.
    assert_eq!(support::scripts_run(&during), 3, "{during:?}");
    assert_eq!(during.get("rpush"), Some(&1), "{during:?}");
    assert_eq!(queue_len(&server, "steady"), 0);
}

/// Two waiters of `name` on `server`, "first" then "second", each a client
/// of its own connecting to `url`, parked in turn with a 30 s maximum park
/// (the first as the head, behind a holder that is not theirs). Each says
/// its name on the receiver once served, then unlocks: the first only once
/// `first_may_go` says so, when given.
fn two_parked_waiters(
    server: &RedisServer,
    name: &'static str,
    url: &str,
    first_may_go: Option<mpsc::Receiver<()>>,
) -> (Vec<thread::JoinHandle<()>>, mpsc::Receiver<&'static str>) {
    let (served, order) = mpsc::channel();
    let mut first_may_go = first_may_go;
    let waiters = ["first", "second"]
        .into_iter()
        .enumerate()
        .map(|(i, who)| {
            let client = Client::builder(url)
                .max_park(Duration::from_secs(30))
                .build()
                .unwrap();
            let served = served.clone();
            let may_go = first_may_go.take();
            let waiter = thread::spawn(move || {
                let guard = client
                    .fair_lock(name)
                    .unwrap()
                    .try_lock_for(Duration::from_secs(25))
                    .unwrap()
                    .expect("served");
                served.send(who).unwrap();
                if let Some(may_go) = may_go {
                    may_go.recv().unwrap();
                }
                guard.unlock().unwrap();
            });
            support::eventually(Duration::from_secs(10), "the waiter parked", || {
                queue_len(server, name) == i as u64 + 1 && support::parked(server) == i as u64 + 1
            });
            waiter
        })
        .collect();
    (waiters, order)
}

/// [`two_parked_waiters`] of `name`, then the second is given an earlier
/// place than the first, as a waiter whose place ended while it lived
/// takes its first arrival again when it comes back. Returns the second's
/// identity too.
fn second_waiter_moved_first(
    server: &RedisServer,
    name: &'static str,
    url: &str,
) -> (
    Vec<thread::JoinHandle<()>>,
    mpsc::Receiver<&'static str>,
    String,
) {
    let (waiters, rx) = two_parked_waiters(server, name, url, None);
    let second = move_second_first(server, name);
    (waiters, rx, second)
}

/// Gives the second of the two places in the queue of `name` an earlier
/// place than the first, as a waiter whose place ended while it lived
/// takes its first arrival again when it comes back; returns its
/// identity.
fn move_second_first(server: &RedisServer, name: &str) -> String {
    let mut con = server.connection();
    let queue = arrivals(&mut con, name);
    let [(_, first), (second, _)] = &queue[..] else {
        panic!("two places: {queue:?}");
    };
    redis::cmd("ZADD")
        .arg(queue_key(name))
        .arg(first - 1.0)
        .arg(second)
        .query::<()>(&mut con)
        .unwrap();
    second.clone()
}

/// Releases `held`, then checks that the waiters of
/// [`second_waiter_moved_first`] are served second first, both within 5 s
/// of the release (their parks last 30 s).
fn served_second_first(
    held: redbaton::LockGuard,
    waiters: Vec<thread::JoinHandle<()>>,
    served: &mpsc::Receiver<&str>,
) {
    let released = Instant::now();
    held.unlock().unwrap();
    let order: Vec<&str> = (0..2)
        .map(|_| {
            served
                .recv_timeout(Duration::from_secs(15))
                .expect("served")
        })
        .collect();
    let took = released.elapsed();
    for waiter in waiters {
        waiter.joined();
    }
    assert_eq!(order, ["second", "first"]);
    assert!(took < Duration::from_secs(5), "both served after {took:?}");
}

/// A waiter parked on the head's list that is no longer the head (another
/// came back to an earlier place) is sent back to look by the next
/// release: else, once it is the head again, its wake-up would come on its
/// own list while it sleeps on the head's list, until its park ends.
#[test]
fn a_head_passed_by_a_waiter_that_came_back_is_still_woken_in_its_turn() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.fair_lock("passed").unwrap().lock().unwrap();
    // The first found itself the head and parks on the head's list.
    let (waiters, served, _) = second_waiter_moved_first(&server, "passed", &server.url());
    served_second_first(held, waiters, &served);
}

/// In `BLPOP` (a user refused `CLIENT TRACKING`), two waiters can be
/// parked on the head's list at once: one that found itself the head, and
/// one that came back to an earlier place since and found itself the head
/// in turn. The release pushes one token, which Redis gives to the one
/// blocked longer; that one is not the head, finds the lock free for
/// another, and pushes the token again for it. Else the head would sleep
/// out its park.
#[test]
fn a_token_on_the_heads_list_that_the_head_did_not_get_is_passed_on_to_it() {
    let server = RedisServer::start();
    let untracked = testkit::untracked_user(&mut server.connection(), &server.url());
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.fair_lock("blocked").unwrap().lock().unwrap();
    let (waiters, served, second) = second_waiter_moved_first(&server, "blocked", &untracked);
    // The second looks (a token on its own list): it finds itself the
    // head, and parks on the head's list behind the first.
    redis::cmd("RPUSH")
        .arg(format!("redbaton:{{blocked}}:fair:wake:{second}"))
        .arg("ok")
        .query::<()>(&mut server.connection())
        .unwrap();
    support::eventually(
        Duration::from_secs(10),
        "the second parked as the head",
        || {
            let next: Option<String> = redis::cmd("HGET")
                .arg("redbaton:{blocked}:fair:lock")
                .arg("next")
                .query(&mut server.connection())
                .unwrap();
            next.as_ref() == Some(&second) && support::parked(&server) == 2
        },
    );
    served_second_first(held, waiters, &served);
}

across_topologies! {
    but_masters;
    /// `try_lock` never takes a place; a waiter that gives up leaves its
    /// place at once, and the next one is served without waiting for it.
    fn try_lock_takes_no_place_and_a_waiter_that_gives_up_leaves_at_once(deployment) {
        let client = deployment.builder().max_park(Duration::from_secs(30)).build().unwrap();
        let lock = client.fair_lock("patience").unwrap();
        let held = lock.lock().unwrap();
        let queue = || queue_of(deployment, "patience");
        let other = lock.clone();
        assert!(thread::spawn(move || other.try_lock().unwrap().is_none()).joined());
        assert_eq!(queue(), 0, "try_lock took a place");
        let other = lock.clone();
        let impatient = thread::spawn(move || other.try_lock_for(Duration::from_millis(300)).unwrap().is_some());
        support::eventually(Duration::from_secs(10), "a waiter has a place", || queue() == 1);
        let other = lock.clone();
        let patient = thread::spawn(move || {
            let got = other.try_lock_for(Duration::from_secs(10)).unwrap();
            (got.is_some(), Instant::now())
        });
        // The impatient waiter leaves the queue before it returns.
        assert!(!impatient.joined(), "the impatient waiter gave up");
        support::eventually(Duration::from_secs(10), "only the patient waiter is left", || queue() == 1);
        let released = Instant::now();
        held.unlock().unwrap();
        let (got, at) = patient.joined();
        assert!(got);
        let after = at.duration_since(released);
        assert!(after < Duration::from_secs(2), "served {after:?} after the release");
        assert_eq!(queue(), 0);
    }
}

#[test]
fn a_killed_waiter_at_the_head_blocks_the_queue_for_one_park_slice_at_most() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.fair_lock("queue").unwrap();
    let held = lock.lock().unwrap();
    let mut doomed = spawn_child("fair_waiter", &server);
    doomed.wait_for_line("WAITING", Duration::from_secs(30));
    support::eventually(Duration::from_secs(10), "the child's place", || {
        queue_len(&server, "queue") == 1
    });
    let other = lock.clone();
    let next = thread::spawn(move || {
        let got = other.try_lock_for(Duration::from_secs(20)).unwrap();
        (got.is_some(), Instant::now())
    });
    support::eventually(Duration::from_secs(10), "the second place", || {
        queue_len(&server, "queue") == 2
    });
    doomed.kill();
    let released = Instant::now();
    held.unlock().unwrap();
    let (got, at) = next.joined();
    assert!(got);
    let after = at.duration_since(released);
    // The dead head's place lives 1.5 park slices (+500 ms) without it.
    println!("served {after:?} after the release, past a dead head");
    assert!(after < Duration::from_millis(1_500), "{after:?}");
}

#[test]
fn a_killed_holders_lock_goes_to_the_next_waiter_when_its_lease_ends() {
    let server = RedisServer::start();
    let mut holder = spawn_child("fair_holder", &server);
    let line = holder.wait_for_line("HOLDING", Duration::from_secs(30));
    let taken_us: u128 = line.trim().parse().unwrap();
    holder.kill();
    let client = support::client(&server);
    let lock = client.fair_lock("crashed").unwrap();
    let guard = lock
        .try_lock_for(Duration::from_secs(10))
        .unwrap()
        .expect("acquired");
    let at = epoch_us();
    let after_ms = (at.saturating_sub(taken_us + 1_000_000)) / 1000;
    println!("acquired {after_ms} ms after the lease ended");
    assert!(at >= taken_us + 990_000, "before the lease ended");
    assert!(after_ms < 500, "{after_ms} ms after the lease ended");
    guard.unlock().unwrap();
}

/// A waiter's first attempt takes its place in the queue, and its wait
/// parks on what that attempt found: one script from the call until it is
/// parked, where a second attempt before parking (to take the place) made
/// two.
#[test]
fn a_waiter_parks_on_its_first_attempt() {
    let server = RedisServer::start();
    let client = patient(&server);
    let lock = client.fair_lock("at-once").unwrap();
    let held = lock.lock().unwrap();
    let wait = move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(20))
            .unwrap()
            .expect("served");
        guard.unlock().unwrap();
    };
    let scripts = support::scripts_until_parked(&server, wait, || held.unlock().unwrap());
    assert_eq!(scripts, 1);
}

#[test]
fn waiting_costs_a_look_and_a_park_per_slice() {
    const WAITERS: u64 = 10;
    const HOLD: Duration = Duration::from_secs(3);
    const MAX_PARK: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(MAX_PARK)
        .build()
        .unwrap();
    let lock = client.fair_lock("popular").unwrap();
    let held = lock.lock().unwrap();
    let before = server.command_calls();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = lock.clone();
            thread::spawn(move || {
                lock.try_lock_for(Duration::from_secs(60))
                    .unwrap()
                    .map(|g| g.unlock().unwrap())
                    .is_some()
            })
        })
        .collect();
    thread::sleep(HOLD);
    let during = server.commands_since(&before);
    held.unlock().unwrap();
    for waiter in waiters {
        assert!(waiter.joined());
    }
    let sent = [
        "evalsha",
        "eval",
        "script|load",
        "blpop",
        "incr",
        "client|id",
    ];
    let total: u64 = sent.iter().filter_map(|c| during.get(*c)).sum();
    let parks = HOLD.as_millis() as u64 / MAX_PARK.as_millis() as u64;
    let bound = WAITERS * (4 + 2 * (parks + 1));
    println!("commands during the hold: {total} (bound {bound}): {during:?}");
    assert!(total <= bound, "{total} > {bound}: {during:?}");
}

#[test]
fn bad_input_damaged_keys_and_a_quorum_are_clear_errors() {
    let server = RedisServer::start();
    let client = support::client(&server);
    assert!(matches!(
        client.fair_lock(""),
        Err(Error::InvalidName { .. })
    ));
    let lock = client.fair_lock("damaged").unwrap();
    assert!(matches!(
        lock.with_fixed_lease(Duration::ZERO),
        Err(Error::InvalidLease { .. })
    ));
    redis::cmd("SET")
        .arg(queue_key("damaged"))
        .arg("not a queue")
        .query::<()>(&mut server.connection())
        .unwrap();
    let err = lock.try_lock().map(|g| g.is_some()).unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    // Naming the key, and what it holds.
    let message = err.to_string();
    assert!(
        message.contains(&queue_key("damaged")) && message.contains("holds a string"),
        "{message}"
    );
    // The places' key too, and a waiting call as a single attempt.
    redis::cmd("DEL")
        .arg(queue_key("damaged"))
        .query::<()>(&mut server.connection())
        .unwrap();
    let places = queue_key("damaged").replace(":queue", ":places");
    redis::cmd("SET")
        .arg(&places)
        .arg("not places")
        .query::<()>(&mut server.connection())
        .unwrap();
    let err = lock.lock().map(drop).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, Error::WrongType { .. }) && message.contains(&places),
        "{message}"
    );
    // The head's list, which every release names: the release says so
    // (and changes nothing).
    let heads = client.fair_lock("damaged heads").unwrap();
    let guard = heads.lock().unwrap();
    redis::cmd("SET")
        .arg("redbaton:{damaged heads}:fair:lock:next")
        .arg("not a list")
        .query::<()>(&mut server.connection())
        .unwrap();
    let err = guard.unlock().unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    assert!(
        heads.is_locked().unwrap(),
        "a refused release changed nothing"
    );
    // The plain lock of the same name is another object.
    let plain = client.lock("damaged").unwrap().try_lock().unwrap();
    assert!(plain.is_some());
    #[cfg(feature = "redlock")]
    {
        let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let quorum = Client::builder(redbaton::Topology::masters(
            masters.iter().map(RedisServer::url),
        ))
        .build()
        .unwrap();
        let err = quorum.fair_lock("q").unwrap_err();
        assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    }
}

across_topologies! {
    but_masters;
    /// `Lock::queued_waiters` counts the live places of a fair lock's
    /// queue: not a place that ended (a dead waiter's, not purged yet),
    /// and nothing for a plain lock, whose waiters Redis does not record.
    fn queued_waiters_counts_the_live_places_of_the_queue(deployment) {
        let client = deployment.builder().max_park(Duration::from_secs(30)).build().unwrap();
        let lock = client.fair_lock("counted").unwrap();
        let held = lock.lock().unwrap();
        assert_eq!(lock.queued_waiters().unwrap(), 0);
        // A dead waiter's place that ended long ago, as the scripts leave
        // it until their next purge.
        let places = "redbaton:{counted}:fair:lock:places";
        let mut raw = deployment.server_for(places).connection();
        let _: () = redis::pipe()
            .cmd("ZADD").arg(places).arg(1).arg("ghost:1")
            .cmd("ZADD").arg(queue_key("counted")).arg(1).arg("ghost:1")
            .query(&mut raw)
            .unwrap();
        assert_eq!(lock.queued_waiters().unwrap(), 0, "an ended place counted");
        // Two threads, each its own place.
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let lock = lock.clone();
                thread::spawn(move || lock.try_lock_for(Duration::from_secs(20)).unwrap().is_some())
            })
            .collect();
        support::eventually(Duration::from_secs(10), "two live places", || {
            lock.queued_waiters().unwrap() == 2
        });
        // Their arrival purged the ghost.
        assert_eq!(queue_of(deployment, "counted"), 2);
        // A plain lock of the same name, waited for: nothing recorded.
        let plain = client.lock("counted").unwrap();
        let plain_held = plain.lock().unwrap();
        let other = plain.clone();
        let plain_waiter = thread::spawn(move || other.try_lock_for(Duration::from_secs(20)).unwrap().is_some());
        assert_eq!(plain.queued_waiters().unwrap(), 0);
        plain_held.unlock().unwrap();
        assert!(plain_waiter.joined());
        held.unlock().unwrap();
        for waiter in waiters {
            assert!(waiter.joined());
        }
        assert_eq!(lock.queued_waiters().unwrap(), 0);
    }
}

/// The commands docs/security.md adds to the lock's ACL line for the fair
/// lock.
const FAIR_ACL: &str = "+hget +zadd +zrem +zrange +zrangebyscore +zscore";

/// The ACL line plus the fair lock's commands, as docs/security.md states
/// them: a fair lock works under a user limited to them (taking it, a
/// waiter of another client parked and then served, `try_lock`, the
/// queue's length, the holder, renewals, `force_unlock`).
#[test]
fn everything_works_under_a_user_limited_to_the_documented_acl() {
    assert!(
        support::security_page_says(FAIR_ACL),
        "docs/security.md lists {FAIR_ACL}"
    );
    let server = RedisServer::start();
    let url = support::documented_acl_user(&server, "fair", FAIR_ACL);
    let open = || {
        Client::builder(url.as_str())
            .default_lease(Duration::from_millis(300))
            .max_park(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let (client, other) = (open(), open());
    let lock = client.fair_lock("acl").unwrap();
    let guard = lock.lock().unwrap();
    let waiting = other.fair_lock("acl").unwrap();
    assert!(waiting.try_lock().unwrap().is_none());
    let handle = thread::spawn(move || {
        waiting
            .try_lock_for(Duration::from_secs(5))
            .map(|g| g.map(|g| g.unlock()).is_some())
    });
    support::eventually(Duration::from_secs(3), "the waiter's place", || {
        lock.queued_waiters().unwrap() == 1
    });
    // Held past the waiter's park: it looks again, keeping its place.
    support::eventually(Duration::from_secs(3), "renewals past a park", || {
        client.watchdog_stats().renewals >= 4
    });
    assert!(lock.holder().unwrap().is_some());
    guard.unlock().unwrap();
    assert!(handle.joined().unwrap());
    let again = lock.lock().unwrap();
    assert!(lock.force_unlock().unwrap());
    assert!(matches!(again.unlock(), Err(Error::LockLost { .. })));
}

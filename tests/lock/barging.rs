//! Barging across clients: a thread that releases and takes the lock again
//! at once must not starve the waiters of another client (another
//! process, as far as Redis can tell). Its release wakes one of them, whose
//! wake-up takes a few round trips; meanwhile the lock waits for a waiter
//! (a short hand-over window), so the thread that just released it queues
//! like anyone else.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{self, eventually, JoinWithin};
use redbaton::Client;
use testkit::{FaultProxy, RedisServer};

/// How long each holder keeps the lock.
const HOLD: Duration = Duration::from_millis(2);

/// Entries the waiting client makes.
const ENTRIES: usize = 10;

/// The longest any of them may wait: a few hundred of the hog's cycles
/// (a starved waiter waits out its whole `try_lock_for`).
const BOUND: Duration = Duration::from_secs(2);

#[test]
fn a_thread_that_takes_the_lock_again_at_once_does_not_starve_another_clients_waiter() {
    let server = RedisServer::start();
    let hog_client = Client::open(&server.url()).unwrap();
    let waiting_client = Client::open(&server.url()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let hog = {
        let lock = hog_client.lock("barged").unwrap();
        let (stop, cycles) = (Arc::clone(&stop), Arc::clone(&cycles));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.lock().unwrap();
                thread::sleep(HOLD);
                guard.unlock().unwrap();
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    eventually(Duration::from_secs(10), "the hog cycles", || {
        cycles.load(Ordering::Relaxed) >= 20
    });

    let lock = waiting_client.lock("barged").unwrap();
    let (mut got, mut longest) = (0, Duration::ZERO);
    for _ in 0..ENTRIES {
        let asked = Instant::now();
        let guard = lock.try_lock_for(Duration::from_secs(10)).unwrap();
        longest = longest.max(asked.elapsed());
        let Some(guard) = guard else { break };
        got += 1;
        thread::sleep(HOLD);
        guard.unlock().unwrap();
        // Back as a newcomer, behind the hog's waiting thread.
        thread::sleep(HOLD);
    }
    stop.store(true, Ordering::Relaxed);
    hog.joined();
    assert!(
        got == ENTRIES && longest <= BOUND,
        "the waiting client got {} of {ENTRIES} entries, longest wait {longest:?} (bound \
         {BOUND:?}), while the hog cycled {} times",
        got,
        cycles.load(Ordering::Relaxed)
    );
}

/// A release goes to the waiter of another client that found the
/// ownership in its way, even when a waiter of the holder's own client,
/// woken by the same release, comes first: the processes of a plain lock
/// take turns. Before, whichever parker came first took the lock, and a
/// process whose parker was a little slower could lose a hundred
/// hand-offs in a row. Here the holder's client passes nothing in memory
/// (so that each of its releases goes through Redis), its own waiter
/// parked first (so its connection hears the release first), and each
/// round asserts who is served first.
#[test]
fn a_release_goes_to_another_clients_waiter_before_the_holders_own() {
    const NAME: &str = "turns";
    const ROUNDS: usize = 10;
    let server = RedisServer::start();
    let home = Client::builder(server.url())
        .max_local_handoffs(0)
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let other = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    for round in 0..ROUNDS {
        let held = home.lock(NAME).unwrap().lock().unwrap();
        let (tell, served) = mpsc::channel();
        // A waiter on a thread of its own, told when to unlock.
        let wait = |client: &Client, who: &'static str| {
            let lock = client.lock(NAME).unwrap();
            let tell = tell.clone();
            let (go, may_go) = mpsc::channel::<()>();
            let waiter = thread::spawn(move || {
                let guard = lock
                    .try_lock_for(Duration::from_secs(20))
                    .unwrap()
                    .expect("served");
                tell.send(who).unwrap();
                may_go
                    .recv_timeout(Duration::from_secs(20))
                    .expect("told to unlock");
                guard.unlock().unwrap();
            });
            (waiter, go)
        };
        let (own, own_go) = wait(&home, "the holder's own client");
        eventually(Duration::from_secs(10), "the home waiter parked", || {
            support::parked(&server) == 1
        });
        let (others, others_go) = wait(&other, "another client");
        queued_and_parked(&server, NAME, 2);
        held.unlock().unwrap();
        let released = Instant::now();
        let first = served
            .recv_timeout(Duration::from_secs(10))
            .expect("a waiter served");
        let took = released.elapsed();
        own_go.send(()).unwrap();
        others_go.send(()).unwrap();
        let second = served
            .recv_timeout(Duration::from_secs(10))
            .expect("the other waiter served");
        own.joined();
        others.joined();
        // The window is the other client's alone for its first 10 ms: a
        // machine so loaded that its waiter did not come by then proves
        // nothing either way.
        if first != "another client" && took >= Duration::from_millis(9) {
            eprintln!("round {round} inconclusive: served {took:?} after the release");
            continue;
        }
        assert_eq!(
            (first, second),
            ("another client", "the holder's own client"),
            "round {round}: who was served first"
        );
    }
}

#[test]
fn a_window_its_waiter_left_costs_a_newcomer_little_and_a_try_lock_nothing() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lock = client.lock("left").unwrap();
    let held = lock.lock().unwrap();
    // A waiter of another client looks, parks, and gives up: the release
    // opens a window for it (its attempts marked the ownership), which
    // nobody comes to take.
    let waiter = {
        let other = Client::open(&server.url()).unwrap();
        let lock = other.lock("left").unwrap();
        thread::spawn(move || {
            lock.try_lock_for(Duration::from_millis(300))
                .unwrap()
                .is_some()
        })
    };
    assert!(!waiter.joined(), "held throughout");
    held.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "a window is nobody's hold");
    assert!(
        lock.holder().unwrap().is_none(),
        "a window is nobody's hold"
    );
    // A newcomer waits out the window (its attempt is told the window's
    // time left, and it parks that long); a try_lock takes it.
    let asked = Instant::now();
    let guard = lock.lock().unwrap();
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "the newcomer waited {waited:?}"
    );
    guard.unlock().unwrap();
    let second = lock.clone();
    let held = lock.lock().unwrap();
    let waiter = thread::spawn(move || {
        second
            .try_lock_for(Duration::from_millis(300))
            .unwrap()
            .is_some()
    });
    assert!(!waiter.joined(), "held throughout");
    held.unlock().unwrap();
    assert!(
        lock.try_lock().unwrap().is_some(),
        "a try_lock takes a window"
    );
}

/// The waiter a window is kept for takes it, however late its attempt
/// arrives. An attempt says how long its caller has been asking, by the
/// caller's clock when it is sent; the window's age is the server's when
/// it runs. A waiter that began asking shortly before the release, whose
/// attempt is held up on its way (here by a proxy, 40 ms, within the
/// 100 ms window), has been asking for less than that age on arrival: it
/// would be taken for a newcomer and wait the window out, and so would
/// every waiter of its process behind it. The window is kept for the
/// waiter that last found the ownership in its way, whatever its clock
/// says: one attempt takes the lock.
#[test]
fn the_waiter_a_window_is_kept_for_takes_it_however_late_its_attempt_arrives() {
    let window = WindowForALateWaiter::new("late");
    window.proxy.set_delay(Duration::from_millis(40));
    window.held.unlock().unwrap();
    let before = window.server.command_calls();
    window
        .served
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter served");
    let scripts = support::scripts_run(&window.server.commands_since(&before));
    window.proxy.set_delay(Duration::ZERO);
    window.go.send(()).unwrap();
    window.waiter.joined();
    assert_eq!(scripts, 1, "the waiter's attempts until it was served");
}

/// A caller kept out of a window (it started asking after the window
/// opened) looks again soon after the window's waiter took the lock, and
/// waits behind it in Redis, instead of sleeping out the window's time
/// left (with every thread of its process that asks meanwhile queued
/// behind it). Here the waiter's attempt is held up on its way (2 ms by a
/// proxy, about 40 ms all told on this machine), so that the newcomer's
/// first attempt finds the window still open; the newcomer then parks
/// long before the 100 ms window would have ended.
#[test]
fn a_caller_kept_out_of_a_window_waits_behind_its_waiter_once_it_took_the_lock() {
    const NAME: &str = "kept-out";
    let window = WindowForALateWaiter::new(NAME);
    let server = &window.server;
    let newcomer = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    window.proxy.set_delay(Duration::from_millis(2));
    let lock = newcomer.lock(NAME).unwrap();
    window.held.unlock().unwrap();
    let released = Instant::now();
    let late = thread::spawn(move || {
        lock.try_lock_for(Duration::from_secs(20))
            .unwrap()
            .expect("served")
            .unlock()
            .unwrap();
    });
    let took = window
        .served
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter served")
        - released;
    eventually(Duration::from_secs(10), "the newcomer parked", || {
        support::parked(server) == 1
    });
    let parked = released.elapsed();
    window.proxy.set_delay(Duration::ZERO);
    window.go.send(()).unwrap();
    window.waiter.joined();
    late.joined();
    // Sleeping out the window, the newcomer would park 100 ms after the
    // release at the soonest. A waiter that came too late to tell (a
    // machine too loaded) proves nothing either way.
    if took < Duration::from_millis(70) {
        assert!(
            parked < Duration::from_millis(90),
            "the waiter took the lock {took:?} after its release, the newcomer parked {parked:?} after it"
        );
    } else {
        eprintln!("inconclusive: the waiter took the lock {took:?} after its release");
    }
}

/// A lock held by one client that a waiter of another, whose requests go
/// through a proxy, found in its way: it parked after an attempt that
/// marked the holder's ownership, so the release opens a window kept for
/// it. The waiter says when it is served, and unlocks when told.
struct WindowForALateWaiter {
    server: RedisServer,
    proxy: FaultProxy,
    held: redbaton::LockGuard,
    served: mpsc::Receiver<Instant>,
    go: mpsc::Sender<()>,
    waiter: thread::JoinHandle<()>,
}

impl WindowForALateWaiter {
    fn new(name: &'static str) -> Self {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port());
        let holder = Client::open(&server.url()).unwrap();
        // A waiter never granted the lock: its release opens a window.
        let waiting = Client::builder(support::without_grants(&server, &proxy.url()))
            .max_park(Duration::from_secs(30))
            .build()
            .unwrap();
        let held = holder.lock(name).unwrap().lock().unwrap();
        let lock = waiting.lock(name).unwrap();
        let (tell, served) = mpsc::channel();
        let (go, may_go) = mpsc::channel::<()>();
        let waiter = thread::spawn(move || {
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .unwrap()
                .expect("served");
            tell.send(Instant::now()).unwrap();
            may_go
                .recv_timeout(Duration::from_secs(20))
                .expect("told to unlock");
            guard.unlock().unwrap();
        });
        queued_and_parked(&server, name, 1);
        WindowForALateWaiter {
            server,
            proxy,
            held,
            served,
            go,
            waiter,
        }
    }
}

/// Waits until `parked` waiters are parked on `server` and one of them
/// has marked `name`'s ownership `queued` (a window will be kept for it).
fn queued_and_parked(server: &RedisServer, name: &str, parked: u64) {
    let mut conn = server.connection();
    eventually(Duration::from_secs(10), "the waiters parked", || {
        let queued: Option<String> = redis::cmd("HGET")
            .arg(support::lock_key(name))
            .arg("queued")
            .query(&mut conn)
            .unwrap();
        queued.is_some() && support::parked(server) == parked
    });
}

/// Three clients whose threads ask for the lock again as soon as they let
/// it go: each client's turns in Redis (runs of holds, passed in memory
/// between its threads) come in the order their waiters began asking, so
/// between two turns of one client each other client has a turn or two.
/// A waiter kept out of another client's window is kept the next one
/// (before, it slept between looks, marking nothing, and a client sat out
/// 17 to 26 turns in a row here). The waiters parked on the clients'
/// hubs, woken by the server's announcements.
#[test]
fn clients_whose_threads_always_wait_take_turns() {
    let server = RedisServer::start();
    clients_take_turns(&server, &server.url());
}

/// [`clients_whose_threads_always_wait_take_turns`], the waiters parked
/// in `BLPOP` (a user the server refuses `CLIENT TRACKING`): a waiter
/// parked through a window pops the token meant for the window's waiter,
/// and puts it back, and no window makes the waiters spin. (Before, a
/// client sat out 4 to 12 turns in a row here: this one checks the
/// spinning, the hubs' the turns.)
#[test]
fn clients_whose_threads_always_wait_in_blpop_take_turns() {
    let server = RedisServer::start();
    let url = testkit::untracked_user(&mut server.connection(), &server.url());
    clients_take_turns(&server, &url);
}

/// Three clients of three threads each on `url`, cycling on one lock: no
/// client sits out more than a few turns in a row, and the turns cost a
/// bounded number of scripts (none spins on a window).
fn clients_take_turns(server: &RedisServer, url: &str) {
    const NAME: &str = "rotation";
    const CLIENTS: usize = 3;
    const THREADS: usize = 3;
    const RUN: Duration = Duration::from_millis(1500);
    // Strict turns leave 2 other clients' turns between two of one
    // client's; the turns go to the waiter asking longest, not round the
    // clients, and a late waiter that lets its window go to an earlier
    // caller after its first 10 ms (a loaded machine) may cost it a few
    // more (2 to 7 measured; 17 to 26 before, on the hubs).
    const MOST_SAT_OUT: usize = 10;
    // Scripts a turn costs: the taking attempt and the release, the other
    // clients' parkers looking at the release and at the take (3 to 5
    // measured, before and after).
    const MOST_SCRIPTS_PER_TURN: u64 = 12;
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for c in 0..CLIENTS {
        let client = Client::open(url).unwrap();
        for _ in 0..THREADS {
            let lock = client.lock(NAME).unwrap();
            let (order, stop) = (Arc::clone(&order), Arc::clone(&stop));
            threads.push(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
                    let guard = guard.expect("served within 20 s");
                    // Under the lock: the vector's order is the holds'.
                    order.lock().push(c);
                    guard.unlock().unwrap();
                }
            }));
        }
    }
    eventually(Duration::from_secs(20), "every client held it", || {
        let order = order.lock();
        (0..CLIENTS).all(|c| order.contains(&c))
    });
    let warmed = order.lock().len();
    let before = server.command_calls();
    // A stretch of the contention to look at, not a wait for a state.
    thread::sleep(RUN);
    let scripts = server.commands_since(&before).get("evalsha").copied();
    let measured = order.lock().len();
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.joined();
    }
    let order = order.lock();
    // The turns in the stretch: one entry per run of one client's holds.
    let mut turns: Vec<usize> = order[warmed..measured].to_vec();
    turns.dedup();
    let mut last = [None; CLIENTS];
    let mut sat_out = [0; CLIENTS];
    for (i, &c) in turns.iter().enumerate() {
        if let Some(before) = last[c] {
            sat_out[c] = sat_out[c].max(i - before - 1);
        }
        last[c] = Some(i);
    }
    let turns = turns.len() as u64;
    let scripts = scripts.unwrap_or(0);
    eprintln!(
        "{} holds in {turns} turns, {scripts} scripts; most turns sat out per client: \
         {sat_out:?}",
        measured - warmed,
    );
    assert!(turns >= 3 * CLIENTS as u64, "{turns} turns");
    assert!(
        sat_out.iter().all(|&n| n <= MOST_SAT_OUT),
        "a client sat out more than {MOST_SAT_OUT} turns in a row: {sat_out:?}"
    );
    assert!(
        scripts <= MOST_SCRIPTS_PER_TURN * turns,
        "{scripts} scripts for {turns} turns"
    );
}

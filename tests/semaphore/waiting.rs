//! Waiting: a waiter for several permits is woken when they may all be
//! free, and waiting costs a bounded number of commands.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::sem_keys;
use crate::support::{self, JoinWithin};
use redbaton::Client;
use testkit::RedisServer;

across_topologies! { but_masters;
    /// Three permits released one at a time, 400 ms apart: a waiter for all
    /// three gets them soon after the third release (not at the end of a
    /// 10 s park), and not before.
    fn a_waiter_for_three_is_woken_when_the_third_is_released(deployment) {
        let holder = deployment.client();
        let waiter = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let sem = holder.semaphore("triple").unwrap();
        sem.try_set_permits(3).unwrap();
        let held: Vec<_> = (0..3).map(|_| sem.acquire().unwrap()).collect();
        let waiting = waiter.semaphore("triple").unwrap();
        let (got, receive) = mpsc::channel();
        let handle = thread::spawn(move || {
            let permits = waiting
                .try_acquire_many_for(3, Duration::from_secs(30))
                .unwrap()
                .expect("three permits");
            got.send(Instant::now()).unwrap();
            assert_eq!(permits.num_permits(), 3);
            permits.release().unwrap();
        });
        // Let the waiter park first.
        thread::sleep(Duration::from_millis(300));
        let mut last_release = Instant::now();
        for permit in held {
            assert!(receive.try_recv().is_err(), "acquired before the third release");
            // Before the call: the waiter may be served before it returns.
            last_release = Instant::now();
            permit.release().unwrap();
            thread::sleep(Duration::from_millis(400));
        }
        let acquired = receive.recv_timeout(Duration::from_secs(30)).expect("acquired");
        handle.joined();
        let after = acquired.saturating_duration_since(last_release);
        assert!(acquired >= last_release, "acquired before the third release");
        assert!(after < Duration::from_secs(1), "woken {after:?} after the third release");
        assert_eq!(sem.available_permits().unwrap(), 3);
    }
}

across_topologies! { but_masters;
    /// A waiter for three parks first, a waiter of another client for one
    /// parks behind it, and one permit is released: the token reaches the
    /// waiter it can serve (the waiter for three, which may take it first,
    /// passes it on), well before a 10 s park would end. The waiter for
    /// three gets its permits once they are all free. (The waiter for three
    /// never holds others back here: see the tests of `hold_back_after`.)
    fn a_waiter_for_one_is_not_held_up_by_another_clients_waiter_for_three(deployment) {
        let park = Duration::from_secs(10);
        let holder = deployment.client();
        let sem = holder.semaphore("mixed").unwrap();
        sem.try_set_permits(3).unwrap();
        let mut held: Vec<_> = (0..3).map(|_| sem.acquire().unwrap()).collect();
        let (got, receive) = mpsc::channel();
        let waiter = |k: u64, got: mpsc::Sender<(u64, Instant)>| {
            let client = deployment.builder().max_park(park).build().unwrap();
            let waiting = client
                .semaphore("mixed")
                .unwrap()
                .hold_back_after(Duration::MAX);
            thread::spawn(move || {
                let permits = waiting
                    .try_acquire_many_for(k, Duration::from_secs(30))
                    .unwrap()
                    .expect("acquired");
                got.send((k, Instant::now())).unwrap();
                // Hold until told by the channel's end (the test's deadline).
                thread::sleep(Duration::from_millis(500));
                permits.release().unwrap();
            })
        };
        let three = waiter(3, got.clone());
        thread::sleep(Duration::from_millis(300));
        let one = waiter(1, got);
        thread::sleep(Duration::from_millis(300));
        held.pop().unwrap().release().unwrap();
        let released = Instant::now();
        let (k, at) = receive.recv_timeout(Duration::from_secs(30)).expect("a waiter acquired");
        assert_eq!(k, 1, "the waiter for one is served first");
        let after = at.saturating_duration_since(released);
        assert!(after < Duration::from_secs(2), "served {after:?} after the release");
        one.joined();
        // The waiter for one has released; two more make three free.
        for permit in held.drain(..) {
            permit.release().unwrap();
        }
        let released = Instant::now();
        let (k, at) = receive.recv_timeout(Duration::from_secs(30)).expect("the waiter for three");
        assert_eq!(k, 3);
        assert!(at.saturating_duration_since(released) < Duration::from_secs(2));
        three.joined();
        assert_eq!(sem.available_permits().unwrap(), 3);
    }
}

/// Ten waiters (two clients of five threads) during a three-second hold
/// send a bounded number of commands: each client parks one connection,
/// about one BLPOP and one attempt per maximum park; and all of them get
/// their permit once it is released.
#[test]
fn ten_waiters_during_a_three_second_hold_send_a_bounded_number_of_commands() {
    const CLIENTS: u64 = 2;
    const THREADS: u64 = 5;
    const WAITERS: u64 = CLIENTS * THREADS;
    const HOLD: Duration = Duration::from_secs(3);
    const MAX_PARK: Duration = Duration::from_secs(1);

    let server = RedisServer::start();
    let client = |max_park| {
        Client::builder(server.url())
            .max_park(max_park)
            .build()
            .unwrap()
    };
    let holder = client(MAX_PARK);
    let sem = holder.semaphore("scarce").unwrap();
    sem.try_set_permits(1).unwrap();
    let held = sem.acquire().unwrap();

    let before = server.command_calls();
    let (done, finished) = mpsc::channel();
    let waiters: Vec<_> = (0..CLIENTS)
        .flat_map(|_| {
            let waiting = client(MAX_PARK).semaphore("scarce").unwrap();
            (0..THREADS)
                .map(|_| {
                    let (waiting, done) = (waiting.clone(), done.clone());
                    thread::spawn(move || {
                        let permit = waiting
                            .try_acquire_for(Duration::from_secs(60))
                            .unwrap()
                            .expect("a permit");
                        permit.release().unwrap();
                        done.send(()).unwrap();
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect();
    thread::sleep(HOLD);
    let during = server.commands_since(&before);
    let parked = support::parked(&server);
    held.release().unwrap();
    for _ in 0..WAITERS {
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("every waiter gets a permit");
    }
    for waiter in waiters {
        waiter.joined();
    }

    // What the clients sent; INFO commandstats also counts the commands
    // scripts run inside the server.
    let sent = ["evalsha", "eval", "script|load", "blpop", "incr", "zrem"];
    let total: u64 = sent.iter().filter_map(|c| during.get(*c)).sum();
    let parks = HOLD.as_millis() as u64 / MAX_PARK.as_millis() as u64;
    // First attempts (a script call and an INCR for each new thread) plus
    // a small multiple of the parkers' parks.
    let bound = 2 * WAITERS + 2 * CLIENTS * (parks + 2);
    println!("commands sent during the hold: {total} (bound {bound}); all: {during:?}");
    assert!(total <= bound, "{total} commands > {bound}: {during:?}");
    // One parked list per client (a tracked key, or a blocked call where
    // tracking is refused), and one more for the waiter that reserved the
    // permit after waiting its 100 ms: it parks on the reserved baton.
    // Redis 7.0 counts a BLPOP when it blocks, Valkey 8 when it returns, so
    // the count has an upper bound only.
    assert!(
        (1..=CLIENTS + 1).contains(&parked),
        "{parked} parked lists during the hold"
    );
    let blpops = during.get("blpop").copied().unwrap_or(0);
    assert!(
        blpops <= CLIENTS * (parks + 2),
        "{blpops} BLPOPs: one parked connection per client: {during:?}"
    );
    assert_eq!(sem.available_permits().unwrap(), 1);
}

/// A place left by a waiter that has gone (its process died while parked)
/// still counts until it ends, so a release pushes a token for it; the
/// waiter for three that takes the token passes it on a bounded number of
/// times, then parks: it does not spin until the place ends.
#[test]
fn a_token_for_a_waiter_that_has_gone_does_not_make_the_others_spin() {
    let server = RedisServer::start();
    let holder = Client::builder(server.url()).build().unwrap();
    let sem = holder.semaphore("ghost").unwrap();
    sem.try_set_permits(3).unwrap();
    let mut held: Vec<_> = (0..3).map(|_| sem.acquire().unwrap()).collect();
    let waiter = Client::builder(server.url())
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap();
    let waiting = waiter.semaphore("ghost").unwrap();
    let handle = thread::spawn(move || {
        waiting
            .try_acquire_many_for(3, Duration::from_secs(3))
            .unwrap()
            .is_some()
    });
    thread::sleep(Duration::from_millis(300));
    let mut raw = server.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let [_, _, _, waiters, ..] = crate::sem_keys("ghost");
    redis::cmd("ZADD")
        .arg(&waiters)
        .arg(secs * 1000 + micros / 1000 + 10_000)
        .arg("1:a-waiter-that-died")
        .query::<()>(&mut raw)
        .unwrap();
    let before = server.command_calls();
    held.pop().unwrap().release().unwrap();
    thread::sleep(Duration::from_secs(2));
    let during = server.commands_since(&before);
    let scripts = during.get("evalsha").copied().unwrap_or(0);
    println!("during 2 s: {during:?}");
    // The release (and its script's load), the waiter's attempt after the
    // first token and after each token passed on (at most three per live
    // place: six), and its first two attempts if a loaded machine delayed
    // them: a handful, not thousands.
    assert!(scripts <= 12, "{scripts} script calls in 2 s: {during:?}");
    assert!(!handle.joined(), "three never became free");
    drop(held);
}

/// The place that holds newcomers back on semaphore `name`, if any.
fn reserved(server: &RedisServer, name: &str) -> Option<String> {
    let [state, ..] = sem_keys(name);
    redis::cmd("HGET")
        .arg(&state)
        .arg("reserved")
        .query(&mut server.connection())
        .unwrap()
}

/// Nine clients take one of three permits each, over and over, for 100 ms
/// at a time, so that the three are hardly ever free at once: a waiter for
/// all three still gets them, soon after it has waited its 100 ms (it
/// reserves them and the takers of one wait), and the takers go on once it
/// has them.
#[test]
fn a_waiter_for_every_permit_is_not_starved_by_takers_of_one() {
    const TAKERS: usize = 9;
    const PERMITS: u64 = 3;
    const HOLD: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let sem = support::client(&server).semaphore("starve").unwrap();
    sem.try_set_permits(PERMITS).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // When each taker got its permit.
    let (took, taken) = mpsc::channel();
    let takers: Vec<_> = (0..TAKERS)
        .map(|_| {
            let sem = support::client(&server).semaphore("starve").unwrap();
            let (stop, took) = (stop.clone(), took.clone());
            thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(permit) = sem.try_acquire_for(Duration::from_secs(20)).unwrap() {
                        took.send(Instant::now()).unwrap();
                        thread::sleep(HOLD);
                        permit.release().unwrap();
                    }
                }
            })
        })
        .collect();
    // The takers are under way.
    for _ in 0..10 {
        taken
            .recv_timeout(Duration::from_secs(10))
            .expect("a taker took one");
    }
    let waiting = support::client(&server).semaphore("starve").unwrap();
    let asked = Instant::now();
    let all = waiting
        .try_acquire_many_for(PERMITS, Duration::from_secs(5))
        .unwrap();
    let waited = asked.elapsed();
    let held = Instant::now();
    // When the waiter started to give them back: a taker may get one
    // before the release returns.
    let releasing = all.map(|all| {
        thread::sleep(Duration::from_millis(50));
        let releasing = Instant::now();
        all.release().unwrap();
        releasing
    });
    // The takers go on.
    for _ in 0..5 {
        taken
            .recv_timeout(Duration::from_secs(10))
            .expect("a taker took one after");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for taker in takers {
        taker.joined();
    }
    let releasing = releasing.expect("the waiter for all got them within 5 s");
    let inside = taken
        .try_iter()
        .filter(|at| *at > held && *at < releasing)
        .count();
    assert_eq!(inside, 0, "a taker got a permit while all were held");
    assert!(
        waited < Duration::from_secs(2),
        "the waiter for all waited {waited:?}"
    );
    assert_eq!(sem.available_permits().unwrap(), PERMITS);
    assert_eq!(
        reserved(&server, "starve"),
        None,
        "the reservation outlived its waiter's turn"
    );
}

/// A waiter for two of two permits, one of them held, reserves them at
/// once (`hold_back_after(ZERO)`): the free permit goes neither to a
/// `try_acquire` nor to a waiter for one of another client. When the waiter
/// for two gives up, the waiter for one gets the free permit at once, not
/// at the end of its 10 s park.
#[test]
fn a_waiter_that_gives_up_its_reservation_lets_the_waiters_it_held_back_in() {
    let server = RedisServer::start();
    let sem = support::client(&server).semaphore("reserve").unwrap();
    sem.try_set_permits(2).unwrap();
    let held = sem.acquire().unwrap();

    let eager = Client::builder(server.url())
        .max_park(Duration::from_millis(50))
        .build()
        .unwrap()
        .semaphore("reserve")
        .unwrap()
        .hold_back_after(Duration::ZERO);
    let (gave_up, given_up) = mpsc::channel();
    let reserving = thread::spawn(move || {
        let got = eager
            .try_acquire_many_for(2, Duration::from_millis(1_500))
            .unwrap();
        gave_up.send(Instant::now()).unwrap();
        assert!(
            got.is_none(),
            "the waiter for two got both while one was held"
        );
    });
    support::eventually(Duration::from_secs(5), "the reservation", || {
        reserved(&server, "reserve").is_some()
    });
    assert!(
        sem.try_acquire().unwrap().is_none(),
        "a try_acquire took a permit held back for the waiter for two"
    );

    let patient = Client::builder(server.url())
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap()
        .semaphore("reserve")
        .unwrap();
    let (got, acquired) = mpsc::channel();
    let one = thread::spawn(move || {
        let permit = patient
            .try_acquire_for(Duration::from_secs(5))
            .unwrap()
            .expect("the waiter for one got the free permit");
        got.send(Instant::now()).unwrap();
        drop(permit);
    });
    // The waiter for one was refused and waits (its place is there) while
    // the waiter for two still reserves.
    let [_, _, _, waiters, ..] = sem_keys("reserve");
    support::eventually(Duration::from_secs(5), "the waiter for one's place", || {
        let places: Vec<String> = redis::cmd("ZRANGE")
            .arg(&waiters)
            .arg(0)
            .arg(-1)
            .query(&mut server.connection())
            .unwrap();
        places.iter().any(|place| place.starts_with("1:"))
    });
    assert!(
        given_up.try_recv().is_err() && reserved(&server, "reserve").is_some(),
        "the waiter for two gave up before the waiter for one came (raise its deadline)"
    );
    let gave_up_at = given_up
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter for two gave up");
    let acquired_at = acquired
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter for one acquired");
    reserving.joined();
    one.joined();
    assert!(
        acquired_at >= gave_up_at,
        "the waiter for one got a permit held back for the waiter for two"
    );
    let after = acquired_at - gave_up_at;
    assert!(
        after < Duration::from_secs(1),
        "the waiter for one got in {after:?} after"
    );
    assert_eq!(reserved(&server, "reserve"), None);
    drop(held);
}

/// A waiter of another client, parked for the one permit, is woken by its
/// parking hub at the baton list's announcement and pops the baton in its
/// own attempt: no look (`LLEN` + `LPOP`) comes between the release and
/// the attempt. (Its client is refused the grant channel: a release would
/// grant it the permit, see `grants.rs`.)
#[test]
fn another_clients_waiter_takes_the_baton_in_its_attempt_without_a_look() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let waiting = Client::builder(support::without_grants(&server, &server.url()))
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let sem = holder.semaphore("rung").unwrap();
    sem.try_set_permits(1).unwrap();
    let held = sem.acquire().unwrap();
    let other = waiting.semaphore("rung").unwrap();
    let wait = move || {
        let permit = other
            .try_acquire_for(Duration::from_secs(20))
            .unwrap()
            .expect("woken");
        permit.release().unwrap();
    };
    let used = support::hand_off_commands(&server, wait, || held.release().unwrap());
    // Every semaphore script that finds a waiter's place reads the
    // baton's length once (sem_look, in lib/permits.lua): all but the
    // waiter's own release, which finds none. A look would add one.
    let scripts = support::scripts_run(&used);
    assert_eq!(used.get("llen"), Some(&(scripts - 1)), "{used:?}");
    assert_eq!(used.get("lpop"), Some(&1), "{used:?}");
}

/// A waiter's first attempt takes its place, and its wait parks on what
/// that attempt found: one script from the call until it is parked, where
/// the wait's own first attempt made two.
#[test]
fn a_waiter_parks_on_its_first_attempt() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let sem = client.semaphore("at-once").unwrap();
    sem.try_set_permits(1).unwrap();
    let held = sem.acquire().unwrap();
    let wait = move || {
        let permit = sem
            .try_acquire_for(Duration::from_secs(20))
            .unwrap()
            .expect("woken");
        permit.release().unwrap();
    };
    let scripts = support::scripts_until_parked(&server, wait, || held.release().unwrap());
    assert_eq!(scripts, 1);
}

//! Waiting: a waiter for several permits is woken when they may all be
//! free, and waiting costs a bounded number of commands.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::support::JoinWithin;
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
    /// three gets its permits once they are all free.
    fn a_waiter_for_one_is_not_held_up_by_another_clients_waiter_for_three(deployment) {
        let park = Duration::from_secs(10);
        let holder = deployment.client();
        let sem = holder.semaphore("mixed").unwrap();
        sem.try_set_permits(3).unwrap();
        let mut held: Vec<_> = (0..3).map(|_| sem.acquire().unwrap()).collect();
        let (got, receive) = mpsc::channel();
        let waiter = |k: u64, got: mpsc::Sender<(u64, Instant)>| {
            let client = deployment.builder().max_park(park).build().unwrap();
            let waiting = client.semaphore("mixed").unwrap();
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
    let blpops = during.get("blpop").copied().unwrap_or(0);
    assert!(
        (1..=CLIENTS * (parks + 2)).contains(&blpops),
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
    let [_, _, _, waiters, _] = crate::sem_keys("ghost");
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
    // The release (and its script's load), the waiter's attempt after each
    // of the two tokens passed on and after the first, and its first two
    // attempts if a loaded machine delayed them: a handful, not thousands.
    assert!(scripts <= 8, "{scripts} script calls in 2 s: {during:?}");
    assert!(!handle.joined(), "three never became free");
    drop(held);
}

//! What waiting costs and how waiters wake: commands sent while parked,
//! and a writer's release that wakes the parked readers of every client.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::support::{eventually, hand_off_commands, parked, scripts_until_parked, JoinWithin};
use redbaton::Client;
use testkit::RedisServer;

#[test]
fn fourteen_waiters_during_a_three_second_hold_send_a_bounded_number_of_commands() {
    const READERS: u64 = 10;
    const WRITERS: u64 = 4;
    const HOLD: Duration = Duration::from_secs(3);
    const MAX_PARK: Duration = Duration::from_secs(1);

    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.rw_lock("popular").unwrap().write().unwrap();
    let client = Client::builder(server.url())
        .max_park(MAX_PARK)
        .build()
        .unwrap();
    let lock = client.rw_lock("popular").unwrap();

    let before = server.command_calls();
    let (done, finished) = mpsc::channel();
    let waiters: Vec<_> = (0..READERS + WRITERS)
        .map(|i| {
            let (lock, done) = (lock.clone(), done.clone());
            thread::spawn(move || {
                if i < READERS {
                    drop(lock.read().unwrap());
                } else {
                    drop(lock.write().unwrap());
                }
                done.send(()).unwrap();
            })
        })
        .collect();
    thread::sleep(HOLD);
    let during = server.commands_since(&before);
    let parked = parked(&server);
    held.unlock().unwrap();
    for _ in 0..READERS + WRITERS {
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("every waiter gets the lock");
    }
    for waiter in waiters {
        waiter.joined();
    }

    let waiters = READERS + WRITERS;
    let sent = [
        "evalsha",
        "eval",
        "script|load",
        "blpop",
        "incr",
        "client|unblock",
    ];
    let total: u64 = sent.iter().filter_map(|c| during.get(*c)).sum();
    let parks = HOLD.as_millis() as u64 / MAX_PARK.as_millis() as u64;
    // First attempts (a script call and a thread's identity INCR each),
    // then per baton list (readers, writers) about one attempt and one
    // park per maximum park time: one thread per list parks for the
    // process.
    let bound = 2 * waiters + 2 * waiters * parks;
    println!("commands sent during the hold: {total} (bound {bound}); all: {during:?}");
    assert!(total <= bound, "{total} commands > {bound}: {during:?}");
    // The process parks in blocked calls of its own (readers' and
    // writers' batons), issued again only when a list joins one or at the
    // backstop: Redis 7.0 counts a BLPOP when it blocks, Valkey 8 when it
    // returns, so the count has an upper bound only.
    assert!(
        (1..=2).contains(&parked),
        "{parked} blocked connections during the hold"
    );
    let blpops = during.get("blpop").copied().unwrap_or(0);
    assert!(
        blpops <= 2 * (parks + 2),
        "{blpops} BLPOPs: one parked reader and one parked writer per max park: {during:?}"
    );
}

across_topologies! {
    but_masters;
    /// Readers of three clients park behind a writer (10 s parks); the
    /// writer's release wakes them all within a couple of seconds, each
    /// passing a baton on to the next client's parked reader.
    fn a_writers_release_wakes_the_parked_readers_of_every_client(deployment) {
        let holder = deployment.client();
        let held = holder.rw_lock("wake").unwrap().write().unwrap();
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
                thread::spawn(move || {
                    let lock = client.rw_lock("wake").unwrap();
                    let guard = lock.try_read_for(Duration::from_secs(30)).unwrap();
                    let at = Instant::now();
                    // Hold a while, so that the readers overlap.
                    thread::sleep(Duration::from_millis(300));
                    (guard.is_some(), at)
                })
            })
            .collect();
        let server = deployment.server_for(&crate::rw_key("wake", "rbaton"));
        eventually(Duration::from_secs(10), "a reader of each client parked", || {
            parked(server) == 3
        });
        let released_at = Instant::now();
        held.unlock().unwrap();
        for reader in readers {
            let (read, at) = reader.joined();
            assert!(read);
            let after = at.saturating_duration_since(released_at);
            assert!(at >= released_at, "a reader got in while the writer held");
            assert!(after < Duration::from_secs(2), "woken {after:?} after the release, not by a baton");
        }
    }
}

/// A reader and then a writer of another client, each parked behind a
/// write, are woken by their parking hub at their baton list's
/// announcement and pop the baton in their own attempt: no look (`LLEN` +
/// `LPOP`) comes between the release and the attempt. (The waiting client
/// is refused the grant channel: a reader would be granted the read.)
#[test]
fn another_clients_waiters_take_their_baton_in_their_attempt_without_a_look() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let waiting = Client::builder(crate::support::without_grants(&server, &server.url()))
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    for writes in [false, true] {
        let held = holder.rw_lock("rung").unwrap().write().unwrap();
        let lock = waiting.rw_lock("rung").unwrap();
        let wait = move || {
            let wait = Duration::from_secs(20);
            if writes {
                drop(lock.try_write_for(wait).unwrap().expect("woken"));
            } else {
                drop(lock.try_read_for(wait).unwrap().expect("woken"));
            }
        };
        let used = hand_off_commands(&server, wait, || held.unlock().unwrap());
        let what = if writes { "writer" } else { "reader" };
        assert_eq!(used.get("llen"), None, "{what}: {used:?}");
        assert_eq!(used.get("lpop"), Some(&1), "{what}: {used:?}");
    }
}

/// A writer's first attempt takes its place among the waiting writers,
/// and its wait parks on what that attempt found: one script from the
/// call until it is parked, where the wait's own first attempt made two.
#[test]
fn a_writer_parks_on_its_first_attempt() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.rw_lock("at-once").unwrap();
    let held = lock.read().unwrap();
    let wait = move || {
        drop(
            lock.try_write_for(Duration::from_secs(20))
                .unwrap()
                .expect("woken"),
        );
    };
    assert_eq!(scripts_until_parked(&server, wait, || drop(held)), 1);
}

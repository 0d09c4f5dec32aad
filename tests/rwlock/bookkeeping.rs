//! Bookkeeping that key TTLs would hide, with two parties of which one
//! lives on (so no whole key expires on time), and the designed bounds of
//! a wake-up: a writer right after the last reader leaves, a reader right
//! after a writer releases. Waiters park for 10 s here, so that a missing
//! baton or a place left behind shows as seconds, not milliseconds.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::processes::killed_holder;
use crate::support::{self, eventually, parked, JoinWithin};
use crate::{rw_key, waiting_writers};
use redbaton::Client;
use testkit::RedisServer;

/// A waiter's park: only a baton wakes it sooner.
const LONG_PARK: Duration = Duration::from_secs(10);
/// How late a waiter woken by a baton may get in: generous for a loaded
/// machine, far under `LONG_PARK`.
const WAKE_BOUND: Duration = Duration::from_millis(1_000);

#[test]
fn a_killed_readers_hold_ends_at_its_lease_while_another_reader_lives_on() {
    let server = RedisServer::start();
    // A reader with a 3 s lease, SIGKILLed; a live reader keeps the
    // readers set (and its TTL) alive with its renewed 30 s lease.
    let (_, dead_acquired_at) = killed_holder(&server, "hold-read-3s");
    let live = support::client(&server);
    let live_read = live.rw_lock("crash").unwrap().read().unwrap();
    let writer_client = Client::builder(server.url())
        .max_park(LONG_PARK)
        .build()
        .unwrap();
    let writer = thread::spawn(move || {
        let lock = writer_client.rw_lock("crash").unwrap();
        let guard = lock.try_write_for(Duration::from_secs(30)).unwrap();
        let at = Instant::now();
        (guard.map(|g| g.unlock()), at)
    });
    let mut raw = server.connection();
    eventually(Duration::from_secs(10), "the writer's place", || {
        waiting_writers(&mut raw, "crash") == 1
    });
    eventually(Duration::from_secs(10), "the writer parked", || {
        parked(&server) == 1
    });
    // Creates the situation: the dead reader's 3 s lease ends while the
    // live reader still holds (and the writer is parked).
    thread::sleep(Duration::from_millis(3_300).saturating_sub(dead_acquired_at.elapsed()));
    let readers: u64 = redis::cmd("ZCARD")
        .arg(rw_key("crash", "readers"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(
        readers, 2,
        "nothing has looked since the dead reader's lease ended"
    );

    let released_at = Instant::now();
    live_read.unlock().unwrap();
    let (written, at) = writer.joined();
    written.expect("the writer got in").unwrap();
    let late = at.saturating_duration_since(released_at);
    println!("the writer got in {late:?} after the live reader's release");
    // The last live reader's release forgets the dead one and wakes the
    // writer; without that the writer waits out its 10 s park.
    assert!(
        late < WAKE_BOUND,
        "the writer got in {late:?} after the last live reader left"
    );
}

across_topologies! {
    but_masters;
    /// A writer that waited behind a reader and then acquired keeps no
    /// place among the waiting writers: while it holds, `ZCARD` of the
    /// writers set is 0, and after its release a fresh reader enters at
    /// once (a place left behind would refuse it for 10.5 s).
    fn a_writer_that_waited_and_acquired_leaves_no_waiting_place(deployment) {
        let reader = deployment.client();
        let held = reader.rw_lock("place").unwrap().read().unwrap();
        let writer_client = deployment.builder().max_park(LONG_PARK).build().unwrap();
        let (acquired, wait_acquired) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let writer = thread::spawn(move || {
            let lock = writer_client.rw_lock("place").unwrap();
            let guard = lock.try_write_for(Duration::from_secs(30)).unwrap().expect("written");
            acquired.send(()).unwrap();
            wait_release.recv_timeout(Duration::from_secs(30)).unwrap();
            guard.unlock().unwrap();
        });
        let mut raw = deployment.server_for(&rw_key("place", "writers")).connection();
        eventually(Duration::from_secs(10), "the writer's place", || {
            waiting_writers(&mut raw, "place") == 1
        });
        held.unlock().unwrap();
        wait_acquired.recv_timeout(Duration::from_secs(5)).expect("the last reader's baton");
        assert_eq!(waiting_writers(&mut raw, "place"), 0, "the writer left a place behind");
        release.send(()).unwrap();
        writer.joined();

        let fresh = deployment.client();
        let guard = fresh.rw_lock("place").unwrap().try_read().unwrap();
        assert!(guard.is_some(), "a fresh reader after the writer's release waits: {:?}",
            crate::rw_state(&mut raw, "place"));
    }
}

across_topologies! {
    but_masters;
    /// Designed bound: a writer parked behind two readers of two clients
    /// gets in within a moment of the last one's release (its baton), not
    /// at the end of its park.
    fn a_writer_gets_in_within_a_moment_of_the_last_readers_release(deployment) {
        let (a, b) = (deployment.client(), deployment.client());
        let first = a.rw_lock("bound").unwrap().read().unwrap();
        let last = b.rw_lock("bound").unwrap().read().unwrap();
        let writer_client = deployment.builder().max_park(LONG_PARK).build().unwrap();
        let writer = thread::spawn(move || {
            let lock = writer_client.rw_lock("bound").unwrap();
            let guard = lock.try_write_for(Duration::from_secs(30)).unwrap();
            let at = Instant::now();
            (guard.map(|g| g.unlock()), at)
        });
        let server = deployment.server_for(&rw_key("bound", "writers"));
        let mut raw = server.connection();
        eventually(Duration::from_secs(10), "the writer's place", || {
            waiting_writers(&mut raw, "bound") == 1
        });
        eventually(Duration::from_secs(10), "the writer parked", || parked(server) == 1);
        first.unlock().unwrap();
        let released_at = Instant::now();
        last.unlock().unwrap();
        let (written, at) = writer.joined();
        written.expect("the writer got in").unwrap();
        let late = at.saturating_duration_since(released_at);
        println!("a writer got in {late:?} after the last reader's release");
        assert!(late < WAKE_BOUND, "the writer got in {late:?} after the last reader left");
    }
}

/// A `try_read` that a writer refuses will not wait, so the writer's
/// release pushes no read baton on its account (which a reader parking
/// later would pop and try again for nothing); a reader that waits, here
/// a `try_read_for` that gives up while the write is held, is woken by one.
#[test]
fn a_refused_try_read_leaves_no_read_baton_to_push() {
    let server = RedisServer::start();
    let (writer, reader) = (support::client(&server), support::client(&server));
    let (write_lock, read_lock) = (
        writer.rw_lock("tried").unwrap(),
        reader.rw_lock("tried").unwrap(),
    );
    let pushes = |waits: bool| {
        let write = write_lock.write().unwrap();
        if waits {
            let gave_up = read_lock.try_read_for(Duration::from_millis(50)).unwrap();
            assert!(gave_up.is_none(), "the write is held");
        } else {
            assert!(read_lock.try_read().unwrap().is_none(), "the write is held");
        }
        let before = server.command_calls();
        write.unlock().unwrap();
        let used = server.commands_since(&before);
        used.get("rpush").copied().unwrap_or(0)
    };
    assert_eq!(pushes(false), 0, "a try_read's refusal");
    assert_eq!(pushes(true), 1, "a waiting reader's refusal");
}

/// A read and its release with no writer waiting look at the writers
/// once each (`first_place` in lib/rw.lua: the first place, and only when
/// it has ended the others), not purge and count them; a place that has
/// ended is still forgotten by the next read, which takes the lock.
#[test]
fn an_uncontended_read_looks_at_the_writers_once_and_forgets_an_ended_place() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.rw_lock("looked").unwrap();
    // Scripts loaded, the connection open.
    lock.read().unwrap().unlock().unwrap();
    let used = support::commands_of(&server, || lock.read().unwrap().unlock().unwrap());
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_eq!(used.get("zremrangebyscore"), None, "{used:?}");
    assert_eq!(used.get("zrange"), Some(&4), "{used:?}");
    // A waiting writer's place that ended a second ago (its writer gone).
    let mut raw = server.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let ended = secs * 1_000 + micros / 1_000 - 1_000;
    redis::cmd("ZADD")
        .arg(rw_key("looked", "writers"))
        .arg(ended)
        .arg("gone:1")
        .query::<()>(&mut raw)
        .unwrap();
    let reader = lock
        .try_read()
        .unwrap()
        .expect("an ended place keeps no reader out");
    assert_eq!(
        waiting_writers(&mut raw, "looked"),
        0,
        "the place forgotten"
    );
    reader.unlock().unwrap();
}

//! Locks stranded by one failed call, found by an outside review (issue 9,
//! L1–L3): after a stale connection, a lost reply or a busy spell, the lock
//! is free again as soon as Redis answers, and a live holder keeps it.

use crate::support;
use crate::support::{Deployment, Topology};

use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, JoinWithin};
use redbaton::{Client, Error};
use testkit::RedisServer;

/// L1: the server closes idle connections after 1 s (`timeout 1`, as
/// proxies and NAT do); an unlock after 2.5 s idle still releases.
#[test]
fn unlock_after_the_server_closed_idle_connections_releases_the_lock() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let client = support::client(&server);
    let lock = client.lock("idle").unwrap();
    let guard = lock
        .with_fixed_lease(Duration::from_secs(30))
        .unwrap()
        .lock()
        .unwrap();
    thread::sleep(Duration::from_millis(2_500));
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "the lock is stranded");

    // And the next calls after another idle spell work the first time.
    thread::sleep(Duration::from_millis(2_500));
    let again = lock.try_lock().unwrap().expect("free");
    drop(again);
    assert!(!lock.is_locked().unwrap());
}

/// L1: the same after `CLIENT KILL` of every idle connection.
#[test]
fn unlock_after_client_kill_of_idle_connections_releases_the_lock() {
    let deployment = Deployment::start(Topology::Single);
    let (server, client) = (deployment.server(), deployment.client());
    let lock = client.lock("killed").unwrap();
    let guard = lock.lock().unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut server.connection())
        .unwrap();
    assert!(killed >= 1, "the client's idle connection was killed");
    guard.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "the lock is stranded");
}

/// Blocks the server for `busy` with `DEBUG SLEEP`, from a thread of its
/// own; returns once the command is on its way.
fn block_server(server: &RedisServer, busy: Duration) -> thread::JoinHandle<()> {
    let mut raw = server.connection();
    let sleeper = thread::spawn(move || {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(busy.as_secs_f64())
            .query::<()>(&mut raw)
            .unwrap();
    });
    // Long enough for the command to reach the server, far shorter than it.
    thread::sleep(Duration::from_millis(50));
    sleeper
}

/// L2: an acquire whose reply timed out, and which Redis then ran, does not
/// leave the lock held for a whole lease by a thread that has no guard.
#[test]
fn an_acquire_that_timed_out_does_not_leave_the_lock_held() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.lock("unknown").unwrap();
    // Connected, scripts loaded, this thread's identity known: the request
    // that times out is the acquire script itself.
    lock.lock().unwrap().unlock().unwrap();

    let sleeper = block_server(&server, Duration::from_millis(700));
    let err = lock.try_lock().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    sleeper.joined();
    let answered = Instant::now();

    let other = support::client(&server);
    let other_lock = other.lock("unknown").unwrap();
    eventually(
        Duration::from_millis(1_500),
        "the lock taken by the lost request to be freed",
        || !other_lock.is_locked().unwrap(),
    );
    println!("freed {:?} after Redis answered again", answered.elapsed());
    assert!(other_lock.try_lock().unwrap().is_some());
}

/// L2, for releases: a last release that failed is finished once Redis
/// answers again.
#[test]
fn a_release_that_timed_out_is_finished_when_redis_answers() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.lock("release").unwrap();
    let guard = lock.lock().unwrap();

    let sleeper = block_server(&server, Duration::from_millis(700));
    let err = guard.unlock().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    sleeper.joined();

    let other = support::client(&server);
    let other_lock = other.lock("release").unwrap();
    eventually(Duration::from_millis(1_500), "the release to land", || {
        !other_lock.is_locked().unwrap()
    });
}

/// Runs a script that keeps Redis busy for `busy` (reads only, so that it
/// ends by itself); with `busy-reply-threshold 100`, every other client gets
/// `BUSY` replies after 100 ms of it.
fn busy_script(server: &RedisServer, busy: Duration) -> thread::JoinHandle<()> {
    const SPIN: &str = "local t = redis.call('TIME') \
        local start = t[1] * 1000000 + t[2] \
        while true do \
          local now = redis.call('TIME') \
          if now[1] * 1000000 + now[2] - start > tonumber(ARGV[1]) then return 1 end \
        end";
    let mut raw = server.connection();
    let spinner = thread::spawn(move || {
        redis::cmd("EVAL")
            .arg(SPIN)
            .arg(0)
            .arg(busy.as_micros() as u64)
            .query::<()>(&mut raw)
            .unwrap();
    });
    // Past the threshold: from now on, others get BUSY.
    thread::sleep(Duration::from_millis(200));
    spinner
}

/// L3: a renewal that meets `BUSY` is retried, not taken as a loss.
#[test]
fn the_watchdog_rides_out_a_busy_spell_and_keeps_the_lock() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "100"]);
    let client = Client::builder(server.url())
        .default_lease(Duration::from_secs(3))
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = client.lock("busy").unwrap();
    let guard = lock.lock().unwrap();
    // Renewals are due every second; the first goes through (and loads the
    // script), the second falls inside the busy spell.
    thread::sleep(Duration::from_millis(1_500));
    assert_eq!(client.watchdog_stats().renewals, 1);
    busy_script(&server, Duration::from_millis(1_500)).joined();

    let other = support::client(&server);
    let intruder = other.lock("busy").unwrap();
    for _ in 0..4 {
        assert!(
            intruder.try_lock().unwrap().is_none(),
            "another client took the lock of a live holder"
        );
        thread::sleep(Duration::from_secs(1));
    }
    assert!(!guard.is_lost());
    assert_eq!(client.watchdog_stats().losses, 0);
    guard.unlock().unwrap();
}

/// L3, for waiters: `BUSY` while waiting is ridden out until the deadline,
/// not returned at once.
#[test]
fn a_waiter_rides_out_a_busy_spell_within_its_deadline() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "100"]);
    let holder = support::client(&server);
    let waiter = support::client(&server);
    let guard = holder.lock("busy-wait").unwrap().lock().unwrap();
    let spinner = busy_script(&server, Duration::from_millis(1_000));
    let lock = waiter.lock("busy-wait").unwrap();
    let waiting = thread::spawn(move || {
        lock.try_lock_for(Duration::from_secs(5))
            .map(|guard| guard.is_some())
    });
    spinner.joined();
    guard.unlock().unwrap();
    let got = waiting.joined();
    assert!(matches!(got, Ok(true)), "the waiter gave up: {got:?}");
}

/// A `BUSY` reply reaches a caller that does not wait as its own error,
/// which says it will pass.
#[test]
fn busy_is_reported_as_unavailable() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "100"]);
    let client = support::client(&server);
    let lock = client.lock("busy-once").unwrap();
    lock.is_locked().unwrap();
    let spinner = busy_script(&server, Duration::from_millis(600));
    let err = lock.try_lock().unwrap_err();
    spinner.joined();
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_transient(),
        "{err}"
    );
    assert!(err.to_string().contains("BUSY"), "{err}");
}

/// No lock of the client is held while a command is in flight: with Redis
/// paused during a renewal round, local questions answer at once, and a
/// lock call of another name completes as soon as Redis answers it.
#[test]
fn a_slow_renewal_round_does_not_stall_other_lock_calls() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .default_lease(Duration::from_millis(600))
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let held = client.lock("renewed").unwrap();
    let guard = held.lock().unwrap();
    let rounds = client.watchdog_stats().rounds;
    server.pause();
    // A round is due every 200 ms: one is now in flight, waiting for Redis.
    thread::sleep(Duration::from_millis(400));
    let asked = Instant::now();
    assert!(held.is_held_by_current_thread());
    assert!(
        asked.elapsed() < Duration::from_millis(100),
        "a local question waited {:?} for the renewal round",
        asked.elapsed()
    );
    let other = client.lock("other").unwrap();
    let trying = thread::spawn(move || {
        let guard = other.try_lock();
        (Instant::now(), guard.map(|g| g.is_some()))
    });
    thread::sleep(Duration::from_millis(300));
    let resumed = Instant::now();
    server.resume();
    let (done, got) = trying.joined();
    assert!(got.unwrap(), "the other name was free");
    assert!(
        done.saturating_duration_since(resumed) < Duration::from_millis(500),
        "try_lock finished {:?} after Redis resumed",
        done.saturating_duration_since(resumed)
    );
    // The round that was in flight comes back too (its count is updated
    // when it ends, which may be just after the other call's reply).
    eventually(Duration::from_secs(2), "the renewal round to end", || {
        client.watchdog_stats().rounds > rounds
    });
    drop(guard);
}

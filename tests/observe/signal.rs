//! The loss signal (`lost()` on guards and permits, `Lock::using`): each
//! cause of a loss this suite can bring about fires it once with its
//! reason, from a held guard; a release, whatever it finds, never does.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use redbaton::{Client, Error, LostReason};
use testkit::RedisServer;

use crate::support::{eventually, lock_key};

/// Generous bound for a signal the watchdog sends within one renewal
/// round (a third of the lease here) of the loss.
const SOON: Duration = Duration::from_secs(5);

/// A client whose watchdog renews every 200 ms (a 600 ms lease).
fn short_lease_client(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .default_lease(Duration::from_millis(600))
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

fn redis(server: &RedisServer, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query(&mut server.connection()).unwrap();
}

/// The reason `lost` brings within `SOON`.
fn fired(lost: &Receiver<LostReason>) -> LostReason {
    lost.recv_timeout(SOON)
        .unwrap_or_else(|err| panic!("the loss signal did not fire: {err}"))
}

#[test]
fn a_fixed_lease_fires_lease_ended_at_its_validity_deadline() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lock = client
        .lock("fixed")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(400))
        .unwrap();
    let guard = lock.lock().unwrap();
    let lost = guard.lost();
    assert_eq!(lost.try_recv(), Err(TryRecvError::Empty), "not before");
    let reason = fired(&lost);
    let late = Instant::now().saturating_duration_since(guard.valid_until());
    assert_eq!(reason, LostReason::LeaseEnded);
    assert!(guard.is_lost(), "fired at or after the deadline");
    // Not a watchdog round later (the client's default lease is 30 s): at the
    // deadline, give or take a loaded machine's scheduling.
    assert!(late < Duration::from_millis(400), "fired {late:?} late");
    // Once: nothing more, and the watchdog drops its sender (just after
    // sending, on its own thread: not necessarily before `fired` returns).
    assert_eq!(
        lost.recv_timeout(SOON),
        Err(RecvTimeoutError::Disconnected),
        "once"
    );
}

#[test]
fn extend_moves_the_deadline_a_fixed_lease_signal_fires_at() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lock = client
        .lock("extended")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(300))
        .unwrap();
    let guard = lock.lock().unwrap();
    let lost = guard.lost();
    let first_end = guard.valid_until();
    guard.extend(Duration::from_millis(1200)).unwrap();
    assert_eq!(fired(&lost), LostReason::LeaseEnded);
    let fired_at = Instant::now();
    assert!(
        fired_at >= guard.valid_until()
            && guard.valid_until() > first_end + Duration::from_millis(500),
        "fired at the extended end, not the first one"
    );
}

#[test]
fn a_key_deleted_by_another_client_fires_gone() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let guard = client.lock("deleted").unwrap().lock().unwrap();
    let lost = guard.lost();
    redis(&server, &["DEL", &lock_key("deleted")]);
    assert_eq!(fired(&lost), LostReason::Gone);
    assert!(guard.is_lost());
    assert_eq!(client.watchdog_stats().losses, 1);
}

#[test]
fn force_unlock_fires_gone() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let guard = client.lock("forced").unwrap().lock().unwrap();
    let lost = guard.lost();
    let other = Client::open(&server.url()).unwrap();
    assert!(other.lock("forced").unwrap().force_unlock().unwrap());
    assert_eq!(fired(&lost), LostReason::Gone);
}

#[test]
fn a_lock_taken_by_another_owner_after_force_unlock_fires_taken_over() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .default_lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let guard = client.lock("taken").unwrap().lock().unwrap();
    let lost = guard.lost();
    let other = Client::open(&server.url()).unwrap();
    let lock = other.lock("taken").unwrap();
    // Before the first renewal (a second in): it finds the new owner.
    assert!(lock.force_unlock().unwrap());
    let theirs = lock.try_lock().unwrap().expect("free after force_unlock");
    assert_eq!(fired(&lost), LostReason::TakenOver);
    theirs.unlock().unwrap();
}

#[test]
fn a_key_overwritten_by_another_owner_fires_taken_over() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let guard = client.lock("overwritten").unwrap().lock().unwrap();
    let lost = guard.lost();
    redis(
        &server,
        &["HSET", &lock_key("overwritten"), "flag", "someone-else"],
    );
    assert_eq!(fired(&lost), LostReason::TakenOver);
}

#[test]
fn redis_unreachable_until_the_lease_end_fires_unreachable() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let guard = client.lock("unreachable").unwrap().lock().unwrap();
    let lost = guard.lost();
    server.kill();
    assert_eq!(fired(&lost), LostReason::Unreachable);
    assert!(
        Instant::now() >= guard.valid_until(),
        "not before the lease could have ended"
    );
}

#[test]
fn read_guards_and_permits_fire_not_held_when_their_keys_go() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let rw = client.rw_lock("shared").unwrap();
    let read = rw.read().unwrap();
    let semaphore = client.semaphore("pool").unwrap();
    semaphore.try_set_permits(2).unwrap();
    let permit = semaphore.acquire().unwrap();
    let (read_lost, permit_lost) = (read.lost(), permit.lost());
    redis(&server, &["FLUSHALL"]);
    assert_eq!(fired(&read_lost), LostReason::NotHeld);
    assert_eq!(fired(&permit_lost), LostReason::NotHeld);
}

#[test]
fn fixed_lease_permits_and_write_guards_fire_lease_ended() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lease = Duration::from_millis(300);
    let semaphore = client.semaphore("fixed-pool").unwrap();
    semaphore.try_set_permits(1).unwrap();
    let permit = semaphore
        .with_fixed_lease(lease)
        .unwrap()
        .acquire()
        .unwrap();
    let write = client
        .rw_lock("fixed-rw")
        .unwrap()
        .with_fixed_lease(lease)
        .unwrap()
        .write()
        .unwrap();
    let (permit_lost, write_lost) = (permit.lost(), write.lost());
    assert_eq!(fired(&permit_lost), LostReason::LeaseEnded);
    assert_eq!(fired(&write_lost), LostReason::LeaseEnded);
    assert!(permit.is_lost() && write.is_lost());
}

#[test]
fn dropping_or_unlocking_a_guard_never_fires_its_signal() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let lock = client.lock("dropped").unwrap();

    // A renewed lock, dropped.
    let guard = lock.lock().unwrap();
    let lost = guard.lost();
    drop(guard);
    assert_eq!(lost.try_recv(), Err(TryRecvError::Disconnected));

    // A fixed lease, dropped before its end: nothing at the end either.
    let guard = lock
        .with_fixed_lease(Duration::from_millis(200))
        .unwrap()
        .lock()
        .unwrap();
    let lost = guard.lost();
    drop(guard);
    assert_eq!(
        lost.recv_timeout(Duration::from_millis(600)),
        Err(RecvTimeoutError::Disconnected)
    );

    // A lock deleted behind the guard's back, unlocked before the watchdog
    // looked: the release reports the loss; the signal says nothing.
    let long = Client::open(&server.url()).unwrap();
    let guard = long.lock("dropped").unwrap().lock().unwrap();
    let lost = guard.lost();
    redis(&server, &["DEL", &lock_key("dropped")]);
    assert!(matches!(guard.unlock(), Err(Error::LockLost { .. })));
    assert_eq!(lost.try_recv(), Err(TryRecvError::Disconnected));

    // A permit released.
    let semaphore = client.semaphore("released").unwrap();
    semaphore.try_set_permits(1).unwrap();
    let permit = semaphore.acquire().unwrap();
    let lost = permit.lost();
    permit.release().unwrap();
    assert_eq!(lost.try_recv(), Err(TryRecvError::Disconnected));

    // A permit whose holding was removed behind its back, released before
    // the watchdog looked.
    let semaphore = long.semaphore("released").unwrap();
    let permit = semaphore.acquire().unwrap();
    let lost = permit.lost();
    redis(&server, &["DEL", "redbaton:{released}:sem:holders"]);
    assert!(matches!(permit.release(), Err(Error::PermitsLost { .. })));
    assert_eq!(lost.try_recv(), Err(TryRecvError::Disconnected));
}

#[test]
fn an_inner_release_leaves_the_outer_guards_signal_armed() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let lock = client.lock("reentered").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let lost = inner.lost();
    inner.unlock().unwrap();
    assert_eq!(lost.try_recv(), Err(TryRecvError::Empty), "still held");
    redis(&server, &["DEL", &lock_key("reentered")]);
    assert_eq!(fired(&lost), LostReason::Gone);
    drop(outer);
}

#[test]
fn a_signal_asked_for_after_the_loss_fires_at_once() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let guard = client.lock("late").unwrap().lock().unwrap();
    redis(&server, &["DEL", &lock_key("late")]);
    eventually(SOON, "the watchdog finds the loss", || guard.is_lost());
    assert_eq!(guard.lost().try_recv(), Ok(LostReason::Gone));
    assert_eq!(
        guard.lost().try_recv(),
        Ok(LostReason::Gone),
        "each receiver"
    );
}

#[test]
fn using_hands_the_work_a_signal_to_check_and_wait_on() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let lock = client.lock("used").unwrap();

    let kept = lock.using(|lost| (lost.is_lost(), lost.reason())).unwrap();
    assert_eq!(kept, (false, None));

    let mut seen = None;
    let ended = lock.using(|lost| {
        redis(&server, &["DEL", &lock_key("used")]);
        seen = lost.wait_timeout(SOON);
        assert!(lost.is_lost(), "checked again after the wait");
    });
    assert_eq!(seen, Some(LostReason::Gone));
    assert!(matches!(ended, Err(Error::LockLost { .. })), "{ended:?}");
}

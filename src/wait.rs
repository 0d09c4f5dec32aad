//! The wait loop: how a thread that lost the race waits for the lock without
//! spinning.
//!
//! In Redis, a waiter parks in `BLPOP` on the lock's baton list for
//! min(time left before its deadline, the holder's remaining lease + a margin,
//! the maximum park time). It wakes with a baton (the holder released) or by
//! timeout (the holder's lease ran out, or it is time to look again), and then
//! makes one acquire attempt, even when its deadline has just passed, so a
//! baton it took is never dropped unused.
//!
//! Inside one process, threads waiting for the same lock name queue up (see
//! `local_queue`): one of them (the *parker*) waits in Redis for all, the
//! others sleep until the lock is handed to them by a releasing thread of
//! this process, or until it is their turn to park. So a process holds at
//! most one parked connection per lock name, however many of its threads
//! wait, and parked connections come from their own pool, so they never take
//! a connection a releasing holder needs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{breaks_connection, describe_io, Error};
use crate::keys::LockKeys;
use crate::local_queue::{Grant, LocalQueues, Turn};
use crate::ownership::LeaseMode;
use crate::pool::Pool;

/// Added to the holder's remaining lease so that the waiter wakes just
/// after Redis expires the key, not just before.
const LEASE_END_MARGIN: Duration = Duration::from_millis(5);

/// What one acquire attempt found.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    /// The lock is ours.
    Acquired(T),
    /// Someone else holds it; their lease ends in `lease_left` (`None`: the
    /// key has no TTL, so only a release will free it).
    Held { lease_left: Option<Duration> },
}

/// Settings of the wait loop, taken from the client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitSettings {
    pub(crate) max_park: Duration,
    pub(crate) io_timeout: Duration,
}

/// How a wait ended.
#[derive(Debug)]
pub(crate) enum Waited<T> {
    /// An attempt of this thread acquired the lock.
    Acquired(T),
    /// A releasing thread of this process handed the lock over.
    Granted(Grant),
    /// The deadline passed.
    TimedOut,
}

/// Waits until `attempt` acquires, the lock is handed over, or `deadline`
/// passes (`None`: no deadline). The caller, `identity`, wants a lease of
/// `mode`.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
pub(crate) fn wait_until<T>(
    queues: &LocalQueues,
    parking: &Pool,
    settings: WaitSettings,
    keys: &LockKeys,
    identity: &Arc<str>,
    mode: LeaseMode,
    deadline: Option<Instant>,
    mut attempt: impl FnMut() -> Result<Attempt<T>, Error>,
) -> Result<Waited<T>, Error> {
    let member = queues.join(&keys.lock, identity, mode);
    loop {
        match member.next_turn(deadline) {
            Turn::TimedOut => return Ok(Waited::TimedOut),
            Turn::Granted(grant) => return Ok(Waited::Granted(grant)),
            Turn::Retry => match attempt() {
                Ok(Attempt::Acquired(value)) => return Ok(Waited::Acquired(value)),
                Ok(Attempt::Held { .. }) => {}
                // Redis is failing: the parker meets that too, and reports
                // it after riding out a few failures; wait on meanwhile.
                Err(err) if err.is_transient() => {
                    log::debug!("redbaton: retry after a failed hand-off failed: {err}");
                }
                Err(err) => return Err(err),
            },
            // Leaving, whichever way, hands the parker role on (`Member`'s
            // drop).
            Turn::Park => return park_until_acquired(parking, settings, keys, deadline, attempt),
        }
    }
}

/// Runs `call` until it succeeds or fails for good, riding out transient
/// failures (a failing connection, `BUSY`) as the wait loop does: until
/// `deadline`, or for `patience` without one.
pub(crate) fn ride_out<T>(
    deadline: Option<Instant>,
    patience: Duration,
    mut call: impl FnMut() -> Result<T, Error>,
) -> Result<T, Error> {
    let mut failures = Failures::new(patience);
    loop {
        match call() {
            Err(err) if err.is_transient() => failures.back_off(err, deadline)?,
            other => return other,
        }
    }
}

/// The parker's loop: attempt, park in Redis, attempt again.
fn park_until_acquired<T>(
    parking: &Pool,
    settings: WaitSettings,
    keys: &LockKeys,
    deadline: Option<Instant>,
    mut attempt: impl FnMut() -> Result<Attempt<T>, Error>,
) -> Result<Waited<T>, Error> {
    let mut failures = Failures::new(settings.io_timeout);
    loop {
        // The previous parker may have left because it acquired the lock, so
        // look before parking.
        let lease_left = match attempt() {
            Ok(Attempt::Acquired(value)) => return Ok(Waited::Acquired(value)),
            Ok(Attempt::Held { lease_left }) => {
                failures.reset();
                lease_left
            }
            Err(err) if err.is_transient() => {
                failures.back_off(err, deadline)?;
                continue;
            }
            Err(err) => return Err(err),
        };
        let now = Instant::now();
        let mut park = settings.max_park;
        if let Some(left) = lease_left {
            park = park.min(left + LEASE_END_MARGIN);
        }
        if let Some(deadline) = deadline {
            if deadline <= now {
                return Ok(Waited::TimedOut);
            }
            park = park.min(deadline - now);
        }
        if let Parked::ConnectionFailed(err) = park_in_redis(parking, settings, keys, park)? {
            // A killed or reset parked connection: look again at once, on a
            // fresh connection.
            failures.count(err, deadline)?;
        }
    }
}

/// The least time given to opening a parking connection.
const CONNECT_ALLOWANCE: Duration = Duration::from_millis(50);

/// The first pause after a failed attempt; it doubles with each failure in
/// a row up to [`MAX_BACKOFF`]. This is the only sleep in the wait path, and
/// only while Redis is failing.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);

/// The longest pause between two attempts while Redis is failing.
const MAX_BACKOFF: Duration = Duration::from_millis(160);

/// Failures in a row while waiting: transport errors (a restart, a killed
/// connection) and "not now" replies (`BUSY`, `LOADING`, ...).
///
/// A waiter rides them out until its deadline, and then returns the last
/// error rather than `None`, so that a caller can tell "Redis was failing"
/// from "someone else held the lock". A waiter without a deadline rides
/// them out for `patience` (the I/O timeout) from the first failure in a
/// row, so that `lock()` reports an outage instead of hanging in it.
struct Failures {
    in_a_row: u32,
    since: Option<Instant>,
    patience: Duration,
}

impl Failures {
    fn new(patience: Duration) -> Self {
        Failures {
            in_a_row: 0,
            since: None,
            patience,
        }
    }

    /// An attempt got an answer: the run of failures is over.
    fn reset(&mut self) {
        self.in_a_row = 0;
        self.since = None;
    }

    /// Counts a failure; the error once the waiter's patience is spent.
    /// Returns the time left to ride out.
    fn count(&mut self, err: Error, deadline: Option<Instant>) -> Result<Duration, Error> {
        let now = Instant::now();
        self.in_a_row += 1;
        let since = *self.since.get_or_insert(now);
        let give_up_at = deadline.unwrap_or(since + self.patience);
        if now >= give_up_at {
            return Err(err);
        }
        Ok(give_up_at - now)
    }

    /// Counts a failed attempt and pauses before the next one: Redis
    /// refusing connections answers at once, so retrying without a pause
    /// would spin through the failures in microseconds.
    fn back_off(&mut self, err: Error, deadline: Option<Instant>) -> Result<(), Error> {
        let doublings = self.in_a_row.min(8);
        let left = self.count(err, deadline)?;
        let pause = (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF);
        std::thread::sleep(pause.min(left));
        Ok(())
    }
}

/// How one park ended.
enum Parked {
    /// Woken by a baton or by its timeout.
    Done,
    /// The parked connection failed; it was closed.
    ConnectionFailed(Error),
}

/// One `BLPOP` of at most `park` on the baton list. Whether a baton came
/// does not matter to the caller: either way the next step is an attempt.
fn park_in_redis(
    parking: &Pool,
    settings: WaitSettings,
    keys: &LockKeys,
    park: Duration,
) -> Result<Parked, Error> {
    let park_until = Instant::now() + park;
    // Opening a parking connection may take a round trip or two even when
    // the park itself is short.
    let wait_for_connection = park.max(CONNECT_ALLOWANCE).min(settings.io_timeout);
    let mut conn = match parking.get(wait_for_connection) {
        Ok(conn) => conn,
        // Every parking connection is busy with other lock names: this
        // thread waited here instead, then looks again. Bounded: one attempt
        // per park interval, as when parked.
        Err(Error::PoolTimeout { .. }) => {
            log::debug!("redbaton: no free parking connection for {:?}", keys.name);
            return Ok(Parked::Done);
        }
        // No new parking connection in time: the next attempt, with the full
        // I/O timeout, tells whether Redis is really out of reach.
        Err(err @ Error::Unreachable { .. }) => return Ok(Parked::ConnectionFailed(err)),
        Err(err) => return Err(err),
    };
    let park = park_until.saturating_duration_since(Instant::now());
    if park.is_zero() {
        return Ok(Parked::Done);
    }
    // BLPOP takes seconds with millisecond precision; 0 would mean "forever".
    let millis = park.as_millis().clamp(1, u128::from(u32::MAX));
    let timeout = format!("{}.{:03}", millis / 1000, millis % 1000);
    // The socket must outlast the server-side timeout: a client that gave up
    // first would leave a BLPOP behind that could swallow a baton. If it fails
    // anyway, `Conn::run` marks the connection broken and dropping it closes
    // the socket, which cancels the server-side BLPOP.
    conn.set_read_timeout(park + settings.io_timeout)
        .map_err(|err| Error::from_redis(err, &keys.name, parking.addr()))?;
    let parked: redis::RedisResult<Option<(String, String)>> =
        conn.run(|c| redis::cmd("BLPOP").arg(&keys.baton).arg(&timeout).query(c));
    match parked {
        Ok(_baton) => Ok(Parked::Done),
        // A parked connection that was killed, reset or timed out is closed
        // (never pooled again) and counts as a wake-up: the next attempt, on
        // a command connection, tells whether Redis is really gone, and if
        // not, the waiter parks again on a fresh connection.
        Err(err) if breaks_connection(&err) => {
            log::debug!(
                "redbaton: parked connection for {:?} failed ({}); looking again",
                keys.name,
                describe_io(&err)
            );
            Ok(Parked::ConnectionFailed(Error::from_redis(
                err,
                &keys.name,
                parking.addr(),
            )))
        }
        Err(err) => Err(Error::from_redis(err, &keys.name, parking.addr())),
    }
}

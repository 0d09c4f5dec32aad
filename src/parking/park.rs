//! How long one park lasts, and how a waiter rides out a failing Redis.

use std::time::{Duration, Instant};

use crate::error::Error;

/// Added to the holder's remaining lease so that the waiter wakes just
/// after Redis expires the key, not just before.
const LEASE_END_MARGIN: Duration = Duration::from_millis(5);

/// One park: how long, and whether its end matters to the millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Park {
    pub(super) duration: Duration,
    /// The park ends at the waiter's deadline or the holder's lease end,
    /// not at the maximum park time (which only bounds a lost wake-up, so
    /// the server's timer is precise enough for it).
    pub(super) precise: bool,
}

/// How long to park now: until the holder's lease ends (`lease_left`, plus
/// a margin; `None`: no expiry), the waiter's deadline, or `max_park`,
/// whichever is first. `None` when the deadline has passed.
pub(super) fn park_duration(
    now: Instant,
    lease_left: Option<Duration>,
    deadline: Option<Instant>,
    max_park: Duration,
) -> Option<Park> {
    let mut park = max_park;
    if let Some(left) = lease_left {
        park = park.min(left + LEASE_END_MARGIN);
    }
    if let Some(deadline) = deadline {
        if deadline <= now {
            return None;
        }
        park = park.min(deadline - now);
    }
    Some(Park {
        duration: park,
        precise: park < max_park,
    })
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
///
/// Writes the replicas did not confirm (`replica_acks`) are a run that
/// "held by someone else" does not end: while no replica confirms, every
/// contender's attempt takes the lock, waits for `WAIT`, and undoes it, so
/// the others keep finding it held, and a run they restarted each time
/// would never reach the patience. Only an acquisition ends it, and a
/// waiter without a deadline gives up at the first "held" past its
/// patience too (the holder is most likely another unconfirmed attempt).
pub(super) struct Failures {
    in_a_row: u32,
    since: Option<Instant>,
    /// The last write of the run the replicas did not confirm, if any
    /// (boxed: waiting threads may have small stacks).
    unconfirmed: Option<Box<Error>>,
    patience: Duration,
}

/// A run of unconfirmed writes: when it began, and its last error.
pub(crate) type UnconfirmedRun = (Instant, Box<Error>);

impl Failures {
    pub(super) fn new(patience: Duration) -> Self {
        Failures::resume(patience, None)
    }

    /// Goes on with `run`, a run of unconfirmed writes another waiter of
    /// the same queue met, if any.
    pub(super) fn resume(patience: Duration, run: Option<UnconfirmedRun>) -> Self {
        let (since, unconfirmed) = run.unzip();
        Failures {
            in_a_row: 0,
            since,
            unconfirmed,
            patience,
        }
    }

    /// The run of unconfirmed writes under way, if one is.
    pub(super) fn unconfirmed_run(&self) -> Option<UnconfirmedRun> {
        self.since.zip(self.unconfirmed.clone())
    }

    /// An attempt got an answer (someone else holds it): a run of
    /// transport failures is over; one of unconfirmed writes is not, and
    /// past the patience it is the error of a waiter without a deadline.
    pub(super) fn answered(&mut self, deadline: Option<Instant>) -> Result<(), Box<Error>> {
        self.in_a_row = 0;
        if self.unconfirmed.is_none() {
            self.since = None;
        }
        self.check_unconfirmed(deadline)
    }

    /// The error of a waiter without a deadline whose run of unconfirmed
    /// writes has outlasted its patience.
    pub(super) fn check_unconfirmed(&self, deadline: Option<Instant>) -> Result<(), Box<Error>> {
        match (self.unconfirmed_run(), deadline) {
            (Some((since, err)), None) if Instant::now() >= since + self.patience => Err(err),
            _ => Ok(()),
        }
    }

    /// Counts a failure; the error once the waiter's patience is spent.
    /// Returns the time left to ride out.
    pub(super) fn count(
        &mut self,
        err: Error,
        deadline: Option<Instant>,
    ) -> Result<Duration, Error> {
        let now = Instant::now();
        self.in_a_row += 1;
        // An unconfirmed write failed when its `WAIT` ran out: it was
        // made that much earlier.
        let mut began = now;
        if let Error::NotReplicated { timeout, .. } = &err {
            began = now.checked_sub(*timeout).unwrap_or(now);
            self.unconfirmed = Some(Box::new(err.clone()));
        }
        let since = *self.since.get_or_insert(began);
        let give_up_at = deadline.unwrap_or(since + self.patience);
        if now >= give_up_at {
            return Err(err);
        }
        Ok(give_up_at - now)
    }

    /// Counts a failed attempt and pauses before the next one: Redis
    /// refusing connections answers at once, so retrying without a pause
    /// would spin through the failures in microseconds.
    pub(super) fn back_off(&mut self, err: Error, deadline: Option<Instant>) -> Result<(), Error> {
        let doublings = self.in_a_row.min(8);
        let left = self.count(err, deadline)?;
        let pause = (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF);
        std::thread::sleep(pause.min(left));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_park_ends_at_the_first_of_lease_end_deadline_and_max_park() {
        let now = Instant::now();
        let max = Duration::from_secs(2);
        let ms = Duration::from_millis;
        let park = |duration, precise| Some(Park { duration, precise });
        assert_eq!(park_duration(now, None, None, max), park(max, false));
        assert_eq!(
            park_duration(now, Some(ms(100)), None, max),
            park(ms(105), true)
        );
        assert_eq!(
            park_duration(now, Some(ms(100)), Some(now + ms(50)), max),
            park(ms(50), true)
        );
        assert_eq!(park_duration(now, None, Some(now), max), None);
    }

    #[test]
    fn without_a_deadline_failures_are_ridden_out_for_the_patience_only() {
        let patience = Duration::from_millis(100);
        let started = Instant::now();
        let mut calls = 0;
        let result: Result<(), Error> = ride_out(None, patience, || {
            calls += 1;
            Err(Error::Unavailable {
                addr: "test".into(),
                detail: "BUSY".into(),
            })
        });
        assert!(result.is_err());
        assert!(started.elapsed() >= patience && calls > 1, "{calls} calls");
    }

    #[test]
    fn someone_else_holding_ends_a_run_of_transport_failures_not_of_unconfirmed_writes() {
        let patience = Duration::from_millis(50);
        let unreachable = || Error::Unavailable {
            addr: "test".into(),
            detail: "BUSY".into(),
        };
        let unconfirmed = || Error::NotReplicated {
            addr: "test".into(),
            wanted: 1,
            acknowledged: 0,
            timeout: Duration::from_millis(1),
        };
        let mut failures = Failures::new(patience);
        assert!(failures.count(unreachable(), None).is_ok());
        std::thread::sleep(patience);
        assert!(failures.answered(None).is_ok());
        assert!(failures.count(unreachable(), None).is_ok(), "a new run");

        let mut failures = Failures::new(patience);
        assert!(failures.count(unconfirmed(), None).is_ok());
        assert!(failures.answered(None).is_ok(), "within the patience");
        let run = failures
            .unconfirmed_run()
            .expect("a run of unconfirmed writes");
        std::thread::sleep(patience);
        let deadline = Instant::now() + patience;
        assert!(
            failures.answered(Some(deadline)).is_ok(),
            "until the deadline"
        );
        assert!(
            failures.answered(None).is_err(),
            "the same run, past the patience"
        );
        assert!(failures.count(unconfirmed(), None).is_err());
        // The next parker of the queue goes on with it.
        let mut next = Failures::resume(patience, Some(run.clone()));
        assert!(next.count(unconfirmed(), None).is_err());
        let mut next = Failures::resume(patience, Some(run));
        assert!(next.answered(None).is_err());
    }
}

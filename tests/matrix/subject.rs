//! The per-synchronizer adapters: what entering, leaving and the
//! occupancy marker are for each kind, so that the driver is one loop for
//! all of them. The marker lives on the witness server, apart from the
//! deployment under test, so that no event touches it.

use std::time::Duration;

use redbaton::{Client, Error};
use redbaton::{LockGuard, ReadGuard, SemaphorePermit, WriteGuard};

use crate::spec::{Spec, Sync};

/// A synchronizer handle of one of the matrix's kinds.
pub enum Handle {
    Lock(redbaton::Lock),
    Rw(redbaton::RwLock),
    Sem(redbaton::Semaphore),
    Rate(redbaton::RateLimiter),
    Latch(redbaton::CountDownLatch),
}

/// What a thread holds while inside.
pub enum Held {
    Lock(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Permits(SemaphorePermit),
    /// A rate limiter's permit: nothing to give back.
    Token,
}

/// Witness keys of the occupancy markers.
const OCCUPANT: &str = "occupant";
const READERS: &str = "readers";
const USED: &str = "used";

impl Handle {
    pub fn new(spec: &Spec, client: &Client) -> Handle {
        let name = spec.name.as_str();
        match spec.sync {
            Sync::Lock => Handle::Lock(client.lock(name).unwrap()),
            Sync::Fair => Handle::Lock(client.fair_lock(name).unwrap()),
            Sync::RwLock => Handle::Rw(client.rw_lock(name).unwrap()),
            Sync::Semaphore => Handle::Sem(client.semaphore(name).unwrap()),
            Sync::Rate => Handle::Rate(client.rate_limiter(name).unwrap()),
            Sync::Latch => Handle::Latch(client.count_down_latch(name).unwrap()),
        }
    }

    /// What the test sets once before the workers start.
    pub fn prepare(&self, spec: &Spec) {
        match self {
            Handle::Sem(sem) => {
                sem.try_set_permits(spec.permits).unwrap();
            }
            Handle::Rate(rate) => {
                rate.set_rate(
                    redbaton::RateMode::Overall,
                    spec.permits,
                    Duration::from_secs(1),
                )
                .unwrap();
            }
            _ => {}
        }
    }

    /// One entry by worker thread `index` (every third thread of a
    /// read-write lock writes, the others read); `Ok(None)` when `timeout`
    /// passed first.
    pub fn enter(&self, index: usize, timeout: Duration) -> Result<Option<Held>, Error> {
        Ok(match self {
            Handle::Lock(lock) => lock.try_lock_for(timeout)?.map(Held::Lock),
            Handle::Rw(rw) if index.is_multiple_of(3) => {
                rw.try_write_for(timeout)?.map(Held::Write)
            }
            Handle::Rw(rw) => rw.try_read_for(timeout)?.map(Held::Read),
            Handle::Sem(sem) => sem.try_acquire_for(timeout)?.map(Held::Permits),
            Handle::Rate(rate) => rate.try_acquire_for(1, timeout)?.then_some(Held::Token),
            Handle::Latch(_) => unreachable!("a latch is not entered"),
        })
    }

    /// An entry that shuts every other one out: the lock, a write hold,
    /// every permit of a semaphore.
    pub fn enter_all(&self, permits: u64, timeout: Duration) -> Result<Option<Held>, Error> {
        Ok(match self {
            Handle::Lock(lock) => lock.try_lock_for(timeout)?.map(Held::Lock),
            Handle::Rw(rw) => rw.try_write_for(timeout)?.map(Held::Write),
            Handle::Sem(sem) => sem
                .try_acquire_many_for(permits, timeout)?
                .map(Held::Permits),
            Handle::Rate(_) | Handle::Latch(_) => unreachable!("nothing to hold"),
        })
    }
}

impl Held {
    /// Sets the occupancy marker on the witness; false when it shows
    /// someone else inside that should not be (two holders, a writer with
    /// readers, more permits than `cap`).
    pub fn mark(&self, witness: &mut redis::Connection, cap: u64) -> bool {
        match self {
            Held::Lock(_) => redis::cmd("SET")
                .arg(OCCUPANT)
                .arg(1)
                .arg("NX")
                .query::<bool>(witness)
                .unwrap(),
            Held::Write(_) => {
                let alone: bool = redis::cmd("SET")
                    .arg(OCCUPANT)
                    .arg(1)
                    .arg("NX")
                    .query(witness)
                    .unwrap();
                let readers: Option<i64> = redis::cmd("GET").arg(READERS).query(witness).unwrap();
                alone && readers.unwrap_or(0) == 0
            }
            Held::Read(_) => {
                let _: i64 = redis::cmd("INCR").arg(READERS).query(witness).unwrap();
                !redis::cmd("EXISTS")
                    .arg(OCCUPANT)
                    .query::<bool>(witness)
                    .unwrap()
            }
            Held::Permits(permit) => {
                let used: u64 = redis::cmd("INCRBY")
                    .arg(USED)
                    .arg(permit.num_permits())
                    .query(witness)
                    .unwrap();
                used <= cap
            }
            Held::Token => true,
        }
    }

    /// Takes the marker off again, before the release. Not after an
    /// overlap: the marker is then the other holder's.
    pub fn unmark(&self, witness: &mut redis::Connection, marked: bool) {
        match self {
            Held::Lock(_) | Held::Write(_) if marked => {
                redis::cmd("DEL")
                    .arg(OCCUPANT)
                    .query::<()>(witness)
                    .unwrap();
            }
            Held::Read(_) => {
                redis::cmd("DECR")
                    .arg(READERS)
                    .query::<()>(witness)
                    .unwrap();
            }
            Held::Permits(permit) => {
                redis::cmd("DECRBY")
                    .arg(USED)
                    .arg(permit.num_permits())
                    .query::<()>(witness)
                    .unwrap();
            }
            _ => {}
        }
    }

    /// Whether the hold was lost (its lease ran out).
    pub fn is_lost(&self) -> bool {
        match self {
            Held::Lock(guard) => guard.is_lost(),
            Held::Read(guard) => guard.is_lost(),
            Held::Write(guard) => guard.is_lost(),
            Held::Permits(permit) => permit.is_lost(),
            Held::Token => false,
        }
    }

    /// Gives the hold back.
    pub fn leave(self) -> Result<(), Error> {
        match self {
            Held::Lock(guard) => guard.unlock(),
            Held::Read(guard) => guard.unlock(),
            Held::Write(guard) => guard.unlock(),
            Held::Permits(permit) => permit.release(),
            Held::Token => Ok(()),
        }
    }
}

/// A short name for an error's kind, for the figure lines.
pub fn kind(error: &Error) -> String {
    let debug = format!("{error:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("?")
        .to_owned()
}

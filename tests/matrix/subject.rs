//! The per-synchronizer adapters: what entering, leaving and the
//! occupancy marker are for each kind, so that the driver is one loop for
//! all of them. The marker lives on the witness server, apart from the
//! deployment under test, so that no event touches it. A lock's marker
//! is one key per name, so that a multi-lock's, which marks each of its
//! names, meets the single-name lockers' of the same names.

use std::time::Duration;

use redbaton::{Client, Error};
use redbaton::{LockGuard, MultiLockGuard, ReadGuard, SemaphorePermit, WriteGuard};

use crate::spec::{Spec, Sync};

/// A synchronizer handle of one of the matrix's kinds.
pub enum Handle {
    Lock(redbaton::Lock),
    Rw(redbaton::RwLock),
    Sem(redbaton::Semaphore),
    Rate(redbaton::RateLimiter),
    Latch(redbaton::CountDownLatch),
    /// A multi-lock over [`Spec::names`], and a plain lock of each of
    /// them: threads take the set or one name, so that sets contend with
    /// single-name lockers on every name.
    Multi {
        set: redbaton::MultiLock,
        singles: Vec<redbaton::Lock>,
    },
}

/// What a thread holds while inside.
pub enum Held {
    Lock(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Permits(SemaphorePermit),
    /// Every name of a multi-lock.
    Multi(MultiLockGuard),
    /// A rate limiter's permit: nothing to give back.
    Token,
}

/// Witness keys of the occupancy markers (a lock's, per name:
/// `occupant:<name>`).
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
            Sync::Multi => {
                let names = spec.names();
                Handle::Multi {
                    set: client.multi_lock(&names).unwrap(),
                    singles: names.iter().map(|n| client.lock(n).unwrap()).collect(),
                }
            }
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
    /// read-write lock writes, the others read; of a multi-lock, threads
    /// 1, 4, ... take the set, 0, 3, ... its first name alone and 2, 5,
    /// ... its second); `Ok(None)` when `timeout` passed first.
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
            Handle::Multi { set, .. } if index % 3 == 1 => {
                set.try_lock_for(timeout)?.map(Held::Multi)
            }
            Handle::Multi { singles, .. } => singles[index % 3 / 2]
                .try_lock_for(timeout)?
                .map(Held::Lock),
        })
    }

    /// An entry that shuts every other one out: the lock, a write hold,
    /// every permit of a semaphore, every name of a multi-lock.
    pub fn enter_all(&self, permits: u64, timeout: Duration) -> Result<Option<Held>, Error> {
        Ok(match self {
            Handle::Lock(lock) => lock.try_lock_for(timeout)?.map(Held::Lock),
            Handle::Rw(rw) => rw.try_write_for(timeout)?.map(Held::Write),
            Handle::Sem(sem) => sem
                .try_acquire_many_for(permits, timeout)?
                .map(Held::Permits),
            Handle::Multi { set, .. } => set.try_lock_for(timeout)?.map(Held::Multi),
            Handle::Rate(_) | Handle::Latch(_) => unreachable!("nothing to hold"),
        })
    }
}

impl Held {
    /// Sets the occupancy marker on the witness; false when it shows
    /// someone else inside that should not be (two holders of a name, a
    /// writer with readers, more permits than `cap`).
    pub fn mark(&self, witness: &mut redis::Connection, cap: u64) -> bool {
        match self {
            Held::Lock(guard) => mark_name(witness, guard.name()),
            Held::Multi(guard) => {
                // Every name, even past an overlap: each marker set here is
                // this holder's to take off.
                let mut alone = true;
                for (name, _) in guard.fencing_tokens() {
                    alone &= mark_name(witness, name);
                }
                alone
            }
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
    /// overlap: the marker is then the other holder's (a lock's marker of
    /// a name is taken off only by the holder that set it).
    pub fn unmark(&self, witness: &mut redis::Connection, marked: bool) {
        match self {
            Held::Lock(guard) => unmark_name(witness, guard.name()),
            Held::Multi(guard) => {
                for (name, _) in guard.fencing_tokens() {
                    unmark_name(witness, name);
                }
            }
            Held::Write(_) if marked => {
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
            Held::Multi(guard) => guard.is_lost(),
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
            Held::Multi(guard) => guard.unlock(),
            Held::Token => Ok(()),
        }
    }
}

/// Who holds, as a lock's marker records it: this process and thread (a
/// thread holds one thing at a time).
fn holder() -> String {
    format!("{}:{:?}", std::process::id(), std::thread::current().id())
}

/// Sets the marker of lock name `name`; false when another holder's is
/// there.
fn mark_name(witness: &mut redis::Connection, name: &str) -> bool {
    redis::cmd("SET")
        .arg(format!("{OCCUPANT}:{name}"))
        .arg(holder())
        .arg("NX")
        .query::<bool>(witness)
        .unwrap()
}

/// Takes the marker of lock name `name` off if this holder set it.
fn unmark_name(witness: &mut redis::Connection, name: &str) {
    redis::cmd("EVAL")
        .arg("if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end")
        .arg(1)
        .arg(format!("{OCCUPANT}:{name}"))
        .arg(holder())
        .query::<()>(witness)
        .unwrap();
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

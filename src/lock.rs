//! [`Lock`]: the handle on one lock name, and the ways to acquire it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::ErrorKind;

use crate::client::{millis, validate_lease, Shared};
use crate::error::Error;
use crate::guard::LockGuard;
use crate::keys::LockKeys;
use crate::local_queue::Reservation;
use crate::ownership::LeaseMode;
use crate::scripts;
use crate::wait::{self, Attempt, Waited};
use crate::watchdog::Watchdog;

/// A handle on one distributed lock, made by [`LockClient::lock`].
///
/// Cheap to clone, `Send + Sync`: hand clones to threads. The lock is
/// re-entrant per thread: a thread that holds it may lock it again and gets a
/// second guard; the lock is free once every guard is gone.
///
/// [`LockClient::lock`]: crate::LockClient::lock
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::LockClient::open("redis://127.0.0.1/")?;
/// let lock = client.lock("reports:nightly")?;
///
/// match lock.try_lock_for(Duration::from_millis(500))? {
///     Some(guard) => println!("got it, fencing token {}", guard.fencing_token()),
///     None => println!("someone else is running the report"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
    keys: Arc<LockKeys>,
    /// `None`: renewed by the watchdog while a guard lives.
    fixed_lease: Option<Duration>,
}

/// Who holds a lock, from [`Lock::holder`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's identity: `<client instance uuid>:<thread number>`.
    pub owner: String,
    /// Re-entry depth: how many guards the holder has.
    pub depth: u32,
    /// The fencing token of this ownership.
    pub fencing_token: u64,
    /// Time left on the lease; `None` if the key has no expiry.
    pub remaining_lease: Option<Duration>,
}

impl Lock {
    pub(crate) fn new(shared: Arc<Shared>, keys: LockKeys) -> Lock {
        Lock {
            shared,
            keys: Arc::new(keys),
            fixed_lease: None,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// A handle on the same lock whose acquisitions have a fixed `lease`:
    /// no renewal, the lock ends when the lease does even if the guard still
    /// lives (the guard then reports [`is_lost`](LockGuard::is_lost)).
    ///
    /// Without this, a lock lives as long as its guard: the client's
    /// watchdog renews it every third of the client's default lease, and a
    /// holder that dies frees it within one lease.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms or over a year.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::LockClient::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("batch:export")?.with_fixed_lease(Duration::from_secs(60))?;
    /// let guard = lock.lock()?; // gone after 60 s, whatever happens
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<Lock, Error> {
        validate_lease(lease)?;
        Ok(Lock {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// Who holds the lock now, or `None` when it is free. One script call
    /// (an atomic read); the answer may be stale by the time it arrives.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the key holds something
    /// else.
    pub fn holder(&self) -> Result<Option<Holder>, Error> {
        let reply: Vec<redis::Value> = self.shared.run(&self.keys.name, |c| {
            scripts::HOLDER.key(&self.keys.lock).invoke(c)
        })?;
        if reply.is_empty() {
            return Ok(None);
        }
        let (owner, depth, fence, pttl): (String, u32, u64, i64) =
            redis::from_redis_value(redis::Value::Array(reply)).map_err(|err| {
                Error::from_redis(err.into(), &self.keys.name, self.shared.commands.addr())
            })?;
        Ok(Some(Holder {
            owner,
            depth,
            fencing_token: fence,
            remaining_lease: u64::try_from(pttl).ok().map(Duration::from_millis),
        }))
    }

    /// Blocks until the calling thread holds the lock.
    ///
    /// While another holds it, the thread waits without spinning: in a
    /// `BLPOP` until the holder releases or its lease ends (one thread per
    /// process per lock name parks in Redis; the others wait locally).
    /// Uncontended, this is one script call (plus one `INCR` on a thread's
    /// first call).
    ///
    /// # Errors
    /// Redis failures ([`Error::Unreachable`], [`Error::PoolTimeout`],
    /// [`Error::WrongType`], [`Error::Redis`]). Contention is never an error.
    pub fn lock(&self) -> Result<LockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(None)? {
                return Ok(guard);
            }
        }
    }

    /// One attempt: the guard if the lock was free (or already this
    /// thread's), `None` if another holds it. Never waits, never takes a
    /// baton. One script call.
    ///
    /// # Errors
    /// As [`lock`](Lock::lock).
    pub fn try_lock(&self) -> Result<Option<LockGuard>, Error> {
        let identity = self.shared.identity()?;
        match self.attempt(&identity)? {
            Attempt::Acquired(guard) => Ok(Some(guard)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Like [`lock`](Lock::lock), but gives up after `timeout` and returns
    /// `None`. A timeout too large to be a point in time means no deadline.
    ///
    /// # Errors
    /// As [`lock`](Lock::lock).
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard>, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_lock_until(deadline),
            None => self.lock().map(Some),
        }
    }

    /// Like [`lock`](Lock::lock), but gives up at `deadline` and returns
    /// `None`. A waiter that has just been handed the baton makes its one
    /// attempt even if the deadline passed meanwhile, and returns the guard
    /// if that attempt wins.
    ///
    /// # Errors
    /// As [`lock`](Lock::lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>, Error> {
        self.acquire(Some(deadline))
    }

    /// Runs `critical_section` holding the lock and returns its value.
    ///
    /// # Errors
    /// As [`lock`](Lock::lock); and [`Error::LockLost`] when the lock was no
    /// longer this thread's at release (its lease ran out during the
    /// critical section): the value is dropped, because the section may
    /// have overlapped another holder.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::LockClient::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("counter")?;
    /// let next = lock.with_lock(|| 41 + 1)?;
    /// assert_eq!(next, 42);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_lock<T>(&self, critical_section: impl FnOnce() -> T) -> Result<T, Error> {
        let guard = self.lock()?;
        let value = critical_section();
        guard.unlock()?;
        Ok(value)
    }

    /// Whether anyone holds the lock right now. One `EXISTS`; the answer may
    /// be stale by the time it arrives.
    ///
    /// # Errors
    /// Redis failures.
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.shared.run(&self.keys.name, |c| {
            redis::cmd("EXISTS").arg(&self.keys.lock).query(c)
        })
    }

    /// Removes the lock whoever holds it, at any depth, and wakes one waiter.
    /// Returns whether there was a lock to remove.
    ///
    /// Administrative: the holder is not told until its release fails with
    /// [`Error::LockLost`], and its critical section may overlap the next
    /// holder's.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the key holds something
    /// else (it is left alone).
    pub fn force_unlock(&self) -> Result<bool, Error> {
        let removed: i64 = self.shared.run(&self.keys.name, |c| {
            scripts::FORCE_UNLOCK
                .key(&self.keys.lock)
                .key(&self.keys.baton)
                .arg(millis(self.shared.baton_ttl))
                .invoke(c)
        })?;
        Ok(removed == 1)
    }

    /// The first attempt, then the wait loop until `deadline`.
    fn acquire(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>, Error> {
        let identity = self.shared.identity()?;
        // A newcomer queues behind local waiters instead of trying first, so
        // that they are served in order; a holder re-entering never queues.
        let holds = self.shared.ownerships.held(&self.keys, &identity).is_some();
        if holds || !self.shared.queues.has_waiters(&self.keys.lock) {
            if let Attempt::Acquired(guard) = self.attempt(&identity)? {
                return Ok(Some(guard));
            }
        }
        let waited = wait::wait_until(
            &self.shared.queues,
            &self.shared.parking,
            self.shared.wait,
            &self.keys,
            &identity,
            self.mode(),
            deadline,
            || self.attempt(&identity),
        )?;
        Ok(match waited {
            Waited::Acquired(guard) => Some(guard),
            Waited::Granted(grant) => {
                Some(self.guard(&identity, grant.fence, self.mode(), grant.sent))
            }
            Waited::TimedOut => None,
        })
    }

    /// How this handle's acquisitions keep the lock alive.
    fn mode(&self) -> LeaseMode {
        match self.fixed_lease {
            Some(lease) => LeaseMode::Fixed(lease),
            None => LeaseMode::Renewed(self.shared.default_lease),
        }
    }

    /// The guard of a new or re-entered ownership `fence` of `identity`,
    /// whose request was sent at `sent`.
    fn guard(&self, identity: &Arc<str>, fence: u64, mode: LeaseMode, sent: Instant) -> LockGuard {
        let (status, new_renewal) = self
            .shared
            .ownerships
            .enter(&self.keys, identity, fence, mode, sent);
        if new_renewal {
            Watchdog::wake(&self.shared);
        }
        LockGuard::new(self.clone(), Arc::clone(identity), fence, mode, status)
    }

    /// One run of the acquire script.
    fn attempt(&self, identity: &Arc<str>) -> Result<Attempt<LockGuard>, Error> {
        let mode = self.mode();
        // Re-entry is granted only to the ownership this thread's live guards
        // belong to; the stored depth is set to theirs + 1.
        let (held_fence, guards) = self
            .shared
            .ownerships
            .held(&self.keys, identity)
            .unwrap_or((0, 0));
        let sent = Instant::now();
        let reply: Vec<i64> = self.shared.run(&self.keys.name, |c| {
            scripts::ACQUIRE
                .key(&self.keys.lock)
                .key(&self.keys.fence)
                .arg(&**identity)
                .arg(millis(mode.lease()))
                .arg(held_fence)
                .arg(guards + 1)
                .invoke(c)
        })?;
        match reply[..] {
            [1, fence, _depth] => Ok(Attempt::Acquired(self.guard(
                identity,
                fence.unsigned_abs(),
                mode,
                sent,
            ))),
            [0, lease_left] => Ok(Attempt::Held {
                lease_left: u64::try_from(lease_left).ok().map(Duration::from_millis),
            }),
            _ => Err(Error::Redis {
                source: (
                    ErrorKind::UnexpectedReturnType,
                    "unexpected reply from the acquire script",
                )
                    .into(),
            }),
        }
    }

    /// Runs the release script for the ownership `fence` of `identity`,
    /// which keeps `guards_left` live guards: `Ok(depth left)`.
    pub(crate) fn release(
        &self,
        identity: &str,
        fence: u64,
        guards_left: usize,
        lease: Duration,
    ) -> Result<u64, Error> {
        let left: i64 = self.shared.run(&self.keys.name, |c| {
            scripts::RELEASE
                .key(&self.keys.lock)
                .key(&self.keys.baton)
                .arg(identity)
                .arg(fence)
                .arg(guards_left)
                .arg(millis(lease))
                .arg(millis(self.shared.baton_ttl))
                .invoke(c)
        })?;
        u64::try_from(left).map_err(|_| Error::LockLost {
            name: self.keys.name.clone(),
        })
    }

    /// Passes the ownership `fence` of `identity` straight to the local
    /// waiter `reservation`: `Ok(Some(new fence))`, or `Ok(None)` when
    /// `identity` no longer owns the lock.
    pub(crate) fn hand_off(
        &self,
        identity: &str,
        fence: u64,
        reservation: &Reservation,
    ) -> Result<Option<u64>, Error> {
        let new_fence: i64 = self.shared.run(&self.keys.name, |c| {
            scripts::HANDOFF
                .key(&self.keys.lock)
                .key(&self.keys.fence)
                .arg(identity)
                .arg(fence)
                .arg(&*reservation.identity)
                .arg(millis(reservation.mode.lease()))
                .invoke(c)
        })?;
        Ok(u64::try_from(new_fence).ok())
    }

    /// Owner-checked `PEXPIRE` of the ownership `fence` of `identity`:
    /// whether it was still theirs.
    pub(crate) fn renew(&self, identity: &str, fence: u64, lease: Duration) -> Result<bool, Error> {
        let renewed: i64 = self.shared.run(&self.keys.name, |c| {
            scripts::RENEW
                .key(&self.keys.lock)
                .arg(identity)
                .arg(fence)
                .arg(millis(lease))
                .invoke(c)
        })?;
        Ok(renewed == 1)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.keys.name)
            .field("key", &self.keys.lock)
            .field("fixed_lease", &self.fixed_lease)
            .finish_non_exhaustive()
    }
}

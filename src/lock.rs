//! [`Lock`]: the handle on one lock name, and the ways to acquire it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::ErrorKind;

use crate::client::{validate_lease, Failed, Sent, Shared};
use crate::error::Error;
use crate::guard::LockGuard;
use crate::keys::LockKeys;
use crate::local_queue::Reservation;
use crate::ownership::LeaseMode;
use crate::scripts::lock::{self as calls, AcquireArgs, HandoffArgs};
use crate::scripts::Call;
use crate::wait::{self, Attempt, Waited};
use crate::watchdog::{Cleanup, Watchdog};

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
    /// The lease mode belongs to the ownership, not to the handle: a thread
    /// that already holds the lock and re-enters it through a handle with
    /// another mode joins the ownership as it is (a renewed lock stays
    /// renewed, a fixed one keeps its bound), and re-entry never shortens
    /// the lease.
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
        let call = calls::holder(&self.keys);
        let reply: Vec<redis::Value> = self.shared.run(&self.keys.name, |c| call.invoke(c))?;
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

    /// Whether the calling thread holds this lock through a live guard, as
    /// far as this client knows. No network call: a lock whose lease ran
    /// out unnoticed still counts until its guard learns it (see
    /// [`LockGuard::is_lost`]).
    pub fn is_held_by_current_thread(&self) -> bool {
        self.shared
            .identities
            .cached()
            .is_some_and(|identity| self.shared.ownerships.held(&self.keys, &identity).is_some())
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
        let call = calls::force_unlock(&self.keys, self.shared.baton_ttl);
        let removed: i64 = self.shared.run(&self.keys.name, |c| call.invoke(c))?;
        Ok(removed == 1)
    }

    /// The first attempt, then the wait loop until `deadline`.
    fn acquire(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>, Error> {
        let identity = wait::ride_out(deadline, self.shared.io_timeout, || self.shared.identity())?;
        // A newcomer queues behind local waiters instead of trying first, so
        // that they are served in order; a holder re-entering never queues.
        let holds = self.shared.ownerships.held(&self.keys, &identity).is_some();
        if holds || !self.shared.queues.has_waiters(&self.keys.lock) {
            match self.attempt(&identity) {
                Ok(Attempt::Acquired(guard)) => return Ok(Some(guard)),
                Ok(Attempt::Held { .. }) => {}
                // The wait loop rides out a failing Redis within the
                // deadline, as it does for its own attempts.
                Err(err) if err.is_transient() => {
                    log::debug!("redbaton: first attempt on {:?} failed: {err}", self.name());
                }
                Err(err) => return Err(err),
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
        let (status, mode, new_renewal) = self
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
        // Re-entry is granted only to the ownership this thread's live guards
        // belong to; the stored depth is set to theirs + 1, and the lease is
        // the ownership's, whatever this handle's is.
        let held = self.shared.ownerships.held(&self.keys, identity);
        let (held_fence, guards, mode) = match held {
            Some(held) => (held.fence, held.guards, held.mode),
            None => (0, 0, self.mode()),
        };
        let request = self.shared.next_request();
        let call = calls::acquire(
            &self.keys,
            AcquireArgs {
                identity,
                lease: mode.lease(),
                held_fence,
                depth: guards + 1,
                fence_ttl: self.shared.fence_ttl,
                request,
            },
        );
        let sent = Instant::now();
        let reply: Vec<i64> = match self.shared.exchange(&self.keys.name, |c| call.invoke(c)) {
            Ok(reply) => reply.value,
            Err(failed) => {
                if failed.outcome_unknown {
                    // The script may have run and taken the lock for a
                    // guard that will never exist: undo that request once
                    // Redis answers again.
                    let undo = calls::release_request(
                        &self.keys,
                        identity,
                        request,
                        self.shared.baton_ttl,
                    );
                    self.finish_later(undo, sent, mode.lease());
                }
                return Err(failed.error);
            }
        };
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

    /// Hands `call`, a release that is safe to repeat and whose first send
    /// failed, to the watchdog thread, which sends it until Redis answers or
    /// the lease (at most `lease` from `sent`) has ended anyway.
    pub(crate) fn finish_later(&self, call: Call, sent: Instant, lease: Duration) {
        let cleanup = Cleanup::new(Arc::clone(&self.keys), call, sent, lease);
        Watchdog::clean_up(&self.shared, cleanup);
    }

    /// Runs the release script for the ownership `fence` of `identity`,
    /// which keeps `guards_left` live guards and whose lease is `lease`:
    /// `Ok(depth left)`.
    ///
    /// A last release that fails is finished in the background (see
    /// [`Lock::finish_later`]), so that a lock Redis could not be told about
    /// is freed as soon as Redis answers, not at the end of its lease.
    pub(crate) fn release(
        &self,
        identity: &str,
        fence: u64,
        guards_left: usize,
        lease: Duration,
    ) -> Result<u64, Error> {
        let call = calls::release(
            &self.keys,
            identity,
            fence,
            guards_left,
            lease,
            self.shared.baton_ttl,
        );
        let sent = Instant::now();
        match self
            .shared
            .exchange(&self.keys.name, |c| call.invoke::<i64>(c))
        {
            Ok(Sent { value, resent }) => match u64::try_from(value) {
                Ok(left) => Ok(left),
                // Sent twice and "not the owner" the second time: the first
                // send, cut off on its way back, may have released it.
                Err(_) if resent => Ok(0),
                Err(_) => Err(Error::LockLost {
                    name: self.keys.name.clone(),
                }),
            },
            Err(Failed { error, .. }) => {
                if guards_left == 0 && (error.is_transient() || error.is_timeout()) {
                    self.finish_later(call, sent, lease);
                }
                Err(error)
            }
        }
    }

    /// Passes the ownership `fence` of `identity` straight to the local
    /// waiter `reservation`, under request number `request`:
    /// `Some(new fence)`, or `None` when `identity` no longer owns the lock.
    pub(crate) fn hand_off(
        &self,
        identity: &str,
        fence: u64,
        reservation: &Reservation,
        request: u64,
    ) -> Result<Sent<Option<u64>>, Failed> {
        let call = calls::handoff(
            &self.keys,
            HandoffArgs {
                from: identity,
                fence,
                to: &reservation.identity,
                lease: reservation.mode.lease(),
                fence_ttl: self.shared.fence_ttl,
                request,
            },
        );
        self.shared
            .exchange(&self.keys.name, |c| call.invoke::<i64>(c))
            .map(|sent| Sent {
                value: u64::try_from(sent.value).ok(),
                resent: sent.resent,
            })
    }

    /// The background clean-up of a hand-off that failed: frees the lock
    /// from the releaser (`identity`, `fence`, `lease`) if it still has it,
    /// and from the waiter if request `request` gave it the lock unseen.
    pub(crate) fn finish_failed_hand_off(
        &self,
        identity: &str,
        fence: u64,
        lease: Duration,
        reservation: &Reservation,
        request: u64,
        sent: Instant,
    ) {
        let baton_ttl = self.shared.baton_ttl;
        let release = calls::release(&self.keys, identity, fence, 0, lease, baton_ttl);
        self.finish_later(release, sent, lease);
        let undo = calls::release_request(&self.keys, &reservation.identity, request, baton_ttl);
        self.finish_later(undo, sent, reservation.mode.lease());
    }

    /// Owner-checked renewal of the ownership `fence` of `identity`: the
    /// lock lives at least `lease` more (never less than it already would).
    /// Whether it was still theirs.
    pub(crate) fn renew(&self, identity: &str, fence: u64, lease: Duration) -> Result<bool, Error> {
        let call = calls::renew(&self.keys, identity, fence, lease);
        let renewed: i64 = self.shared.run(&self.keys.name, |c| call.invoke(c))?;
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

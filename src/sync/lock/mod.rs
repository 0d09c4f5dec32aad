//! The lock: [`Lock`] (the handle on one name, and the ways to acquire
//! it), [`LockGuard`] (`guard.rs`), and the Redis protocol under both
//! (`raw.rs`). The handle and the guard depend on the raw protocol, never
//! on each other's internals.

mod guard;
mod multi;
#[cfg(feature = "redlock")]
mod quorum;
mod raw;

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend;
use crate::client_name;
use crate::config::validate_lease;
use crate::context::Context;
use crate::error::Error;
use crate::keys::LockKeys;
use crate::lease::{earlier, Claim, FairRun, Grant, LeaseMode, Leased, RenewLeases};
use crate::observe::{Acquisition, Event, HoldKind, LostSignal};
use crate::parking::{self, Attempt, ParkOn, Waited};
use crate::scripts::lock::{self as calls, AcquireArgs, Asking};
use crate::scripts::reply::{AcquireReply, FairReply, Line, ReleaseReply};

use super::grants::{self, GiveBackSettings, Grantable, Mark};
use crate::backend::Unclaimed;

pub use guard::LockGuard;
pub use multi::{MultiLock, MultiLockGuard};
#[cfg(feature = "redlock")]
pub(crate) use quorum::QuorumLock;
pub(crate) use raw::{DeploymentLock, RawLock};
pub use raw::{Holder, Owner};

use guard::Ownership;

/// A handle on one distributed lock, made by [`Client::lock`].
///
/// Cheap to clone, `Send + Sync`: hand clones to threads. The lock is
/// re-entrant per thread: a thread that holds it may lock it again and gets a
/// second guard; the lock is free once every guard is gone.
///
/// [`Client::lock`]: crate::Client::lock
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
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
    context: Arc<Context>,
    raw: Arc<dyn RawLock>,
    keys: Arc<LockKeys>,
    /// The lock key's lease, as the watchdog renews it.
    leased: Leased,
    /// How this handle's acquisitions keep the lock alive; `None`: renewed
    /// by the watchdog with the client's `default_lease`.
    lease: Option<LeaseMode>,
}

impl Lock {
    pub(crate) fn new(context: Arc<Context>, raw: Arc<dyn RawLock>, keys: LockKeys) -> Lock {
        let kind = if keys.fair.is_some() {
            HoldKind::FairLock
        } else {
            HoldKind::Lock
        };
        let leased = Leased {
            name: keys.name.as_str().into(),
            kind,
            key: keys.lock.as_str().into(),
            renewer: Arc::clone(&raw) as Arc<dyn RenewLeases>,
        };
        Lock {
            context,
            raw,
            keys: Arc::new(keys),
            leased,
            lease: None,
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
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("batch:export")?.with_fixed_lease(Duration::from_secs(60))?;
    /// let guard = lock.lock()?; // gone after 60 s, whatever happens
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<Lock, Error> {
        validate_lease(lease)?;
        Ok(Lock {
            lease: Some(LeaseMode::Fixed(lease)),
            ..self.clone()
        })
    }

    /// A handle on the same lock whose acquisitions have a renewed `lease`
    /// of their own instead of the client's `default_lease`: the watchdog
    /// renews it every third of `lease` while the guard lives, and a holder
    /// that dies frees the lock within `lease`.
    ///
    /// A short lease frees the locks of crashed holders sooner, at the cost
    /// of more renewals (one round trip per third of `lease`, shared with
    /// the client's other locks due at the same time) and of losing the
    /// lock when the process pauses (or cannot reach Redis) for longer than
    /// `lease`. As with [`with_fixed_lease`](Lock::with_fixed_lease), the
    /// lease belongs to the ownership: re-entry through a handle with
    /// another lease joins the ownership as it is.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms or over a year.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("mailer")?.with_lease(Duration::from_secs(5))?;
    /// let guard = lock.lock()?; // held while the guard lives; 5 s after a crash
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<Lock, Error> {
        validate_lease(lease)?;
        Ok(Lock {
            lease: Some(LeaseMode::Renewed(lease)),
            ..self.clone()
        })
    }

    /// Who holds the lock now, or `None` when it is free. One script call
    /// (an atomic read), and a `GET` of the holder's client name; the
    /// answer may be stale by the time it arrives.
    ///
    /// This is what Redis knows: the ownership's owner is the thread that
    /// took it there, and its fencing token the one Redis issued. A
    /// process whose threads hand the lock to each other in memory keeps
    /// that ownership meanwhile, so the thread holding it now may be
    /// another of that client's, under a higher token (see
    /// [`ClientBuilder::max_local_handoffs`](crate::ClientBuilder::max_local_handoffs)).
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the key holds something
    /// else.
    pub fn holder(&self) -> Result<Option<Holder>, Error> {
        let Some(mut holder) = self.raw.holder(&self.keys)? else {
            return Ok(None);
        };
        if self.context.leases.name.is_some() {
            holder.client_name = client_name::name_of(
                &self.context.backend,
                &self.context.config.prefix,
                holder.owner.as_str(),
            )?;
        }
        Ok(Some(holder))
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
        let start = self.context.observer().is_set().then(Instant::now);
        let identity = self
            .context
            .identity()
            .map_err(|err| self.failed(start, err))?;
        let attempt = self.attempt(
            &identity,
            Asking::Once,
            &mut FairPlace::default(),
            false,
            false,
            None,
        );
        match attempt.map_err(|err| self.failed(start, err))? {
            Attempt::Acquired(guard) => {
                Ok(Some(self.acquired(guard, start, Acquisition::FirstAttempt)))
            }
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
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
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

    /// Runs `work` holding the lock, with a [`LostSignal`] it can check or
    /// wait on to stop early if the lock is lost meanwhile (the guard's
    /// [`lost`](LockGuard::lost) signal: a renewal that found the lock
    /// gone or taken over, Redis unreachable until the lease ended, a
    /// fixed lease's end), then releases the lock and returns `work`'s
    /// value.
    ///
    /// # Errors
    /// As [`lock`](Lock::lock); and, as for
    /// [`with_lock`](Lock::with_lock), [`Error::LockLost`] when the lock
    /// was no longer this thread's at release, and Redis failures of the
    /// release: the value is dropped then, because the work may have
    /// overlapped another holder's.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("compaction")?;
    /// let compacted = lock.using(|lost| {
    ///     let mut segments = 0;
    ///     while segments < 8 && !lost.is_lost() {
    ///         segments += 1; // ... compact one segment ...
    ///     }
    ///     segments
    /// })?;
    /// # let _ = compacted;
    /// # Ok(())
    /// # }
    /// ```
    pub fn using<T>(&self, work: impl FnOnce(&LostSignal) -> T) -> Result<T, Error> {
        let guard = self.lock()?;
        let signal = LostSignal::new(guard.lost());
        let value = work(&signal);
        guard.unlock()?;
        Ok(value)
    }

    /// Whether anyone holds the lock right now. One `HEXISTS`; the answer may
    /// be stale by the time it arrives.
    ///
    /// # Errors
    /// Redis failures.
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.raw.is_locked(&self.keys)
    }

    /// For a fair lock ([`Client::fair_lock`](crate::Client::fair_lock)):
    /// how many waiters hold a place in its queue now (a waiter whose
    /// process died keeps its place until it ends, about one park slice).
    /// For a plain lock, 0: its waiters park without a record in Redis.
    /// One round trip; for an operator's look, stale as it arrives.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the queue's key holds
    /// something else.
    pub fn queued_waiters(&self) -> Result<u64, Error> {
        self.raw.queued(&self.keys)
    }

    /// Whether the calling thread holds this lock through a live guard, as
    /// far as this client knows. No network call: a lock whose lease ran
    /// out unnoticed still counts until its guard learns it (see
    /// [`LockGuard::is_lost`]).
    pub fn is_held_by_current_thread(&self) -> bool {
        self.context.identities.cached().is_some_and(|identity| {
            self.context
                .leases
                .registry
                .held(&self.keys.lock, &identity)
                .is_some()
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
        self.raw.force_unlock(&self.keys)
    }

    /// The first attempt, then the wait loop until `deadline`.
    fn acquire(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        self.acquire_from(deadline, true, start)
    }

    /// [`Lock::acquire`] until `until` (`None`: until acquired), without
    /// telling the event hook of the outcome: for a multi-lock taking its
    /// names one at a time, which tells it for the whole set. (Its parks
    /// are told by the wait core as any wait's, and reaching `until` as a
    /// time out only when it is the caller's `last` deadline.)
    pub(super) fn acquire_untold(
        &self,
        until: Option<Instant>,
        last: bool,
    ) -> Result<Option<LockGuard>, Error> {
        self.acquire_from(until, last, None)
    }

    /// [`Lock::acquire`]'s work; the outcome is told to the event hook
    /// when the call started at `start` (`None`: not told), and reaching
    /// `deadline` is told as a time out only when it is the `last` one.
    fn acquire_from(
        &self,
        deadline: Option<Instant>,
        last: bool,
        start: Option<Instant>,
    ) -> Result<Option<LockGuard>, Error> {
        // When this call started asking: a lock in its hand-over window is
        // taken only by a caller that asked before the window opened.
        let asked = Instant::now();
        let context = &self.context;
        let identity =
            parking::ride_out(deadline, context.config.io_timeout, || context.identity())
                .map_err(|err| self.failed(start, err))?;
        // A newcomer queues behind local waiters instead of trying first, so
        // that they are served in order; a holder re-entering never queues.
        let holds = context
            .leases
            .registry
            .held(&self.keys.lock, &identity)
            .is_some();
        // A fair lock's waiter keeps its first arrival across park slices.
        let mut place = FairPlace::default();
        // What the first attempt found, for the wait to park on at once: a
        // fair lock's first attempt took the caller's place in the queue,
        // as the wait's first would (a plain lock's wait attempts again,
        // as a caller that has waited, see `lib/hand_over.lua`).
        let mut first = None;
        // A waiter parked on its client's hub may be granted the lock by
        // its holder's release (see `lib/grant.lua`): from its first
        // attempt on, for a fair lock's (whose wait parks after it).
        let grantable = context.backend.takes_grants().then(Grantable::default);
        if holds || !context.lock_room.has_waiters(&self.keys.baton) {
            let grantable = grantable.as_ref().filter(|_| self.keys.fair.is_some());
            match self.attempt(
                &identity,
                Asking::First,
                &mut place,
                false,
                false,
                grantable,
            ) {
                Ok(Attempt::Acquired(guard)) => {
                    return Ok(Some(self.acquired(guard, start, Acquisition::FirstAttempt)))
                }
                Ok(held @ Attempt::Held { .. }) => {
                    first = self.keys.fair.as_ref().map(|_| held);
                }
                // The wait loop rides out a failing Redis within the
                // deadline, as it does for its own attempts.
                Err(err) if err.is_transient() => {
                    log::debug!("redbaton: first attempt on {:?} failed: {err}", self.name());
                }
                Err(err) => return Err(self.failed(start, err)),
            }
        }
        let claim = Claim {
            identity: Arc::clone(&identity),
            mode: self.mode(),
            takes_passed: true,
        };
        let wait_key = self.wait_key(&identity);
        // A fair waiter keeps its place by coming back every park.
        let watch = self.keys.fair.is_none().then_some(self.keys.lock.as_str());
        // The waiter takes its token in its attempt after a park its
        // list's change ended (see `ParkHow::claims`): the lock's baton,
        // or a fair lock waiter's own list.
        let takes_token = Cell::new(false);
        let claims = Some(&takes_token);
        // Whether the waiter parked after its last attempt (which found
        // the lock held, or in a window: it parks through either): its
        // park may have ended with a token a look popped for it (see
        // `AcquireArgs::after_park`).
        let parked = Cell::new(false);
        let attempt = || {
            if let Some(guard) = grantable
                .as_ref()
                .and_then(|g| self.take_grant(&identity, g, place.arrival))
            {
                return Ok(Attempt::Acquired(guard));
            }
            let asking = Asking::Waited(asked.elapsed());
            let took = takes_token.take();
            let tried = self.attempt(
                &identity,
                asking,
                &mut place,
                took,
                parked.get(),
                grantable.as_ref(),
            );
            parked.set(matches!(tried, Ok(Attempt::Held { .. })));
            tried
        };
        let grant = grantable.as_ref().map(|g| &g.slot);
        let room = &context.lock_room;
        let name = &self.keys.name;
        let waited = match deadline {
            Some(until) if !last => room.wait_a_stretch(
                name, &wait_key, watch, claim, until, claims, grant, first, attempt,
            ),
            _ => room.wait_until(
                name, &wait_key, watch, claim, deadline, claims, grant, first, attempt,
            ),
        };
        let served = matches!(waited, Ok(Waited::Acquired(_) | Waited::Granted(_)));
        // A waiter whose attempt left a grant for it (see `Grantable`).
        let marked = grantable.as_ref().is_some_and(Grantable::is_marked);
        if (self.keys.fair.is_some() || marked) && !served {
            // A fair lock's waiter that leaves without the lock gives its
            // place up at once, rather than blocking the queue until the
            // place expires; a plain lock's takes its grant off, rather
            // than have it granted the lock and give it back.
            if let Err(err) = self.raw.leave_queue(&self.keys, &identity) {
                log::debug!(
                    "redbaton: leaving the queue of {:?} failed: {err}",
                    self.name()
                );
            }
        }
        Ok(match waited? {
            Waited::Acquired(guard) => Some(self.acquired(guard, start, Acquisition::AfterWaiting)),
            Waited::Granted(grant) => {
                let guard = self.granted(&identity, grant);
                Some(self.acquired(guard, start, Acquisition::LocalHandoff))
            }
            Waited::TimedOut => None,
        })
    }

    /// Tells the event hook of `guard`, got `how` after a call that
    /// started at `start` (`None`: no hook was set then).
    fn acquired(&self, guard: LockGuard, start: Option<Instant>, how: Acquisition) -> LockGuard {
        if let Some(start) = start {
            self.context.observer().emit(|| Event::Acquired {
                name: &self.keys.name,
                kind: guard.kind(),
                waited: start.elapsed(),
                fencing_token: Some(guard.fencing_token()),
                how,
            });
        }
        guard
    }

    /// Tells the event hook that an acquisition that started at `start`
    /// (`None`: no hook was set then) failed before any wait with `err`;
    /// returns `err`. A wait that fails is told by the wait core.
    fn failed(&self, start: Option<Instant>, err: Error) -> Error {
        self.context
            .observer()
            .acquire_failed(&self.keys.name, self.kind(), start);
        err
    }

    /// What this lock's guards hold.
    fn kind(&self) -> HoldKind {
        self.leased.kind
    }

    /// The list a waiter parks on: the lock's baton, shared by all its
    /// waiters; for a fair lock, the waiter's own list, which only a
    /// release that makes it the next holder pushes.
    fn wait_key(&self, identity: &str) -> Cow<'_, str> {
        if self.keys.fair.is_some() {
            Cow::Owned(self.keys.wake_list(identity))
        } else {
            Cow::Borrowed(&self.keys.baton)
        }
    }

    /// How this handle's acquisitions keep the lock alive.
    fn mode(&self) -> LeaseMode {
        self.lease
            .unwrap_or(LeaseMode::Renewed(self.context.config.default_lease))
    }

    /// A guard of `thread`'s ownership `fence`, held as `identity` in
    /// Redis, acquired (or re-entered) by a request sent at `sent` asking
    /// for `mode`; `next_in_line`, of a fair lock's fresh acquisition: the
    /// waiter first in the queue behind it.
    fn guard(
        &self,
        thread: &Arc<str>,
        identity: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
        next_in_line: Option<String>,
    ) -> LockGuard {
        let entered = self
            .context
            .enter_as(&self.leased, thread, identity, fence, mode, sent);
        let ownership = Ownership {
            thread: Arc::clone(thread),
            identity: Arc::clone(identity),
            fence,
            token: entered.token,
            mode: entered.mode,
            status: entered.status,
            next_in_line,
            run: entered.run,
        };
        self.guard_of(ownership)
    }

    /// The guard of what a releasing thread of this client handed
    /// `thread`: a fresh ownership its hand-off script made, or its own
    /// ownership passed in memory (already filed under `thread`).
    fn granted(&self, thread: &Arc<str>, grant: Grant) -> LockGuard {
        match grant {
            Grant::Fresh {
                fence,
                sent,
                next_in_line,
            } => self.guard(thread, thread, fence, self.mode(), sent, next_in_line),
            Grant::Passed(passed) => self.guard_of(Ownership {
                thread: Arc::clone(thread),
                identity: passed.identity,
                fence: passed.fence,
                token: passed.token,
                mode: passed.mode,
                status: passed.status,
                next_in_line: passed.run.next_in_line().map(str::to_owned),
                run: passed.run,
            }),
        }
    }

    fn guard_of(&self, ownership: Ownership) -> LockGuard {
        LockGuard::new(
            Arc::clone(&self.context),
            Arc::clone(&self.raw),
            Arc::clone(&self.keys),
            ownership,
        )
    }

    /// The guard of the ownership a release granted this waiter while it
    /// was parked, if one did. `None` too for a grant that came long after
    /// the attempt its park followed: the lease is counted from that
    /// attempt's sending (no later moment is known to precede the grant),
    /// and what would be left of it could be little, so the waiter's
    /// next attempt takes the ownership afresh instead (its own identity's
    /// leftover, under a new token, see `lock/acquire.lua`).
    ///
    /// The grant's lease may be shorter than the waiter's own (see
    /// `grants::GRANT_LEASE`): the guard is recorded as if sent that much
    /// earlier, so that it counts the grant's lease, and its first renewal
    /// is due at once, which lengthens it.
    ///
    /// A fair lock's grant passes along the line of this client's threads
    /// behind the waiter, as a fresh acquisition's reply does, and leaves
    /// the waiter's place (its `arrival`) in the queue: the ownership's
    /// run counts it served, so that its last release drops it.
    fn take_grant(
        &self,
        identity: &Arc<str>,
        grantable: &Grantable,
        arrival: u64,
    ) -> Option<LockGuard> {
        let taken = grantable.take()?.ok()?;
        let (line, next_in_line) = match self.keys.fair {
            Some(_) => Line::of_grant(&taken.receipt.behind)?,
            None => (Line::default(), None),
        };
        let mode = self.mode();
        let sent = taken.counted_from(mode, self.raw.clock_margin(taken.mark.lease))?;
        let token = taken.receipt.token;
        let guard = self.guard(identity, identity, token, mode, sent, next_in_line);
        if self.keys.fair.is_some() {
            let own_place = vec![(identity.to_string(), arrival)];
            self.start_run(&guard, line, own_place);
        }
        Some(guard)
    }

    /// Starts the run of a fresh ownership `guard` along `line`, the
    /// threads of this client next in a fair lock's queue, with the places
    /// `served` already (none, but a grantee's own), if there is any.
    fn start_run(&self, guard: &LockGuard, line: Line, served: Vec<(String, u64)>) {
        if !line.waiters.is_empty() || !served.is_empty() {
            let run = FairRun::new(served, line.waiters, line.after);
            guard.start_run(&self.context.leases.registry, run);
        }
    }

    /// One attempt; `takes_token`: it pops the list this waiter parked on
    /// too (a park of this waiter ended when the list changed, see
    /// `ParkHow::claims`); `after_park`: the waiter parked since its last
    /// attempt. `place`: a fair lock's waiter's, kept across its attempts.
    /// `grantable`: a waiter that may be granted the lock while parked,
    /// whose park after this attempt carries the attempt's ticket.
    fn attempt(
        &self,
        identity: &Arc<str>,
        asking: Asking,
        place: &mut FairPlace,
        takes_token: bool,
        after_park: bool,
        grantable: Option<&Grantable>,
    ) -> Result<Attempt<LockGuard>, Error> {
        // Re-entry is granted only to the ownership this thread's live guards
        // belong to; the stored depth is set to theirs + 1, and the lease is
        // the ownership's, whatever this handle's is.
        let registry = &self.context.leases.registry;
        let held = registry.held(&self.keys.lock, identity);
        // The identity the live guards hold it as: this thread's, unless
        // another thread took it in Redis and passed it on in memory.
        let (owner, held_fence, guards, mode) = match held {
            Some(held) => (held.identity, held.fence, held.guards, held.mode),
            None => (Arc::clone(identity), 0, 0, self.mode()),
        };
        let request = self.context.next_request();
        let args = AcquireArgs {
            identity: &owner,
            lease: mode.lease(),
            held_fence,
            depth: guards + 1,
            fence_ttl: self.context.config.fence_ttl,
            request,
            asking,
            place_ttl: self.context.config.place_ttl(),
            arrival: place.arrival,
            proposed_token: 0,
            reserve: guard::reserve(&self.context, &*self.raw),
            free_only: guards == 0 && registry.lent(&self.keys.lock, identity),
            takes_token,
            after_park,
            baton_ttl: self.context.config.baton_ttl,
            on_heads_list: place.on_heads_list,
            grantable: grantable.and_then(|_| grants::grant_lease(self.mode())),
        };
        let sent = Instant::now();
        match self.raw.attempt(&self.keys, args) {
            Ok(AcquireReply::Acquired {
                fence,
                next_in_line,
                line,
                ..
            }) => {
                // The lease as the slowest clock may count it.
                let sent = earlier(sent, self.raw.clock_margin(mode.lease()));
                let guard = self.guard(identity, &owner, fence, mode, sent, next_in_line);
                // Threads of this client next in the queue: the ownership
                // may pass along them in memory.
                self.start_run(&guard, line, Vec::new());
                Ok(Attempt::Acquired(guard))
            }
            Ok(AcquireReply::Held {
                lease_left,
                arrival: queued,
                handing_over,
                heads_list,
            }) => {
                if place.arrival == 0 {
                    place.arrival = queued;
                }
                if let (Some(grantable), Some(lease)) = (grantable, args.grantable) {
                    // The mark this attempt left names this request: a
                    // grant for it comes after it was sent.
                    let mark = Mark {
                        sent,
                        lease,
                        request,
                    };
                    grantable.mark(backend::ticket(&owner, request), mark);
                }
                place.on_heads_list = heads_list;
                // The head of a fair lock's queue parks on the head's list,
                // which a release pushes itself (see `fair/acquire.lua`).
                let park_on = self
                    .keys
                    .fair
                    .as_ref()
                    .filter(|_| heads_list)
                    .map(|fair| ParkOn {
                        list: fair.next.clone(),
                        claims: true,
                    });
                Ok(Attempt::Held {
                    lease_left,
                    handing_over,
                    park_on,
                    passed_on: false,
                })
            }
            Err(failed) => {
                if failed.outcome_unknown {
                    // The script may have run and taken the lock for a
                    // guard that will never exist: undo that request once
                    // Redis answers again.
                    let undo =
                        raw::undo_later(&self.raw, &self.keys, &owner, request, mode.lease(), sent);
                    self.context.finish_later(undo);
                }
                Err(failed.error)
            }
        }
    }
}

/// Gives back on `conn` the ownership a release granted to
/// `unclaimed.owner`, a waiter of this client that was not parked for it:
/// its last release, as its holder's would be, which wakes (or grants)
/// the next waiter.
pub(super) fn give_back(
    conn: &mut dyn redis::ConnectionLike,
    settings: &GiveBackSettings,
    keys: &LockKeys,
    unclaimed: Unclaimed<'_>,
) -> redis::RedisResult<()> {
    let grants = Some((settings.fence_ttl, settings.channels.as_str()));
    let (lease, baton_ttl) = (settings.lease, settings.baton_ttl);
    let Some(fair) = &keys.fair else {
        let release = calls::release(
            keys,
            unclaimed.owner,
            unclaimed.token,
            0,
            lease,
            baton_ttl,
            grants,
        );
        return release.invoke::<redis::Value>(conn).map(drop);
    };
    let release = calls::fair_release(
        keys,
        fair,
        unclaimed.owner,
        unclaimed.token,
        0,
        lease,
        baton_ttl,
        None,
        &[],
        grants,
    );
    let released: FairReply<ReleaseReply> = release.invoke(conn)?;
    // The head it names is this client's (the grantee, whose place
    // stayed, or a thread of the line the grant passed along): woken on
    // both its lists, as from another process (where it parks is not
    // known: the grant took the lock's record of it).
    let Some(head) = released.wake else {
        return Ok(());
    };
    for list in [&keys.wake_list(&head), &fair.next] {
        calls::push_baton(list, baton_ttl).invoke::<redis::Value>(conn)?;
    }
    Ok(())
}

/// What a fair lock's waiter keeps across its attempts (the plain lock's
/// ignore it).
#[derive(Debug, Default)]
struct FairPlace {
    /// Its arrival in the queue (server µs) as an attempt returned it, 0
    /// before it has one.
    arrival: u64,
    /// Its last attempt found it the head behind a holder: it parks on the
    /// head's list.
    on_heads_list: bool,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.keys.name)
            .field("key", &self.keys.lock)
            .field("lease", &self.mode())
            .finish_non_exhaustive()
    }
}

//! The semaphore: [`Semaphore`] (the handle on one name: its total, and the
//! ways to take permits), [`SemaphorePermit`] (`permit.rs`), and the Redis
//! protocol under both (`raw.rs`). Imports run one way: handle → permit →
//! raw.

mod permit;
mod raw;

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::validate_lease;
use crate::context::Context;
use crate::error::Error;
use crate::keys::SemaphoreKeys;
use crate::lease::{earlier, LeaseMode, Leased, RenewLeases};
use crate::observe::{Acquisition, HoldKind};
use crate::parking::{self, Attempt, ParkOn, Waited};
use crate::scripts::semaphore::{
    AcquireArgs, AcquireReply, Adjust, Refusal, StateReply, TotalReply,
};

use super::grants::{self, GiveBackSettings, Grantable, Mark};
use crate::backend::{self, Unclaimed};

pub use permit::SemaphorePermit;
pub(crate) use raw::{DeploymentSemaphore, RawSemaphore};

/// Gives back on `conn` the permits a release granted to
/// `unclaimed.owner`, a waiter of this client that was not parked for
/// them (see `grants`).
pub(super) fn give_back(
    conn: &mut dyn redis::ConnectionLike,
    settings: &GiveBackSettings,
    keys: &SemaphoreKeys,
    unclaimed: Unclaimed<'_>,
) -> redis::RedisResult<()> {
    let id = format!("{}:{}", unclaimed.owner, unclaimed.request);
    let ends = unclaimed.behind;
    raw::give_back(
        conn,
        keys,
        &id,
        ends,
        settings.baton_ttl,
        &settings.channels,
    )
}

use permit::Held;

/// The most permits a semaphore holds, and the most one call may ask for.
const MAX_PERMITS: u64 = 1_000_000_000_000;

/// How long a waiter waits, by default, before it holds newcomers back (see
/// [`Semaphore::hold_back_after`]). Short enough that a waiter for many
/// permits is not starved by a stream of takers of one; long enough that
/// most waits under ordinary contention end before it.
const HOLD_BACK_AFTER: Duration = Duration::from_millis(100);

/// A handle on one distributed counting semaphore, made by
/// [`Client::semaphore`](crate::Client::semaphore).
///
/// The semaphore holds a total of permits, stored in Redis so that every
/// process agrees on it: set it with
/// [`try_set_permits`](Semaphore::try_set_permits) (the first writer wins)
/// and move it with [`add_permits`](Semaphore::add_permits) and
/// [`reduce_permits`](Semaphore::reduce_permits). Threads of any process
/// take permits with [`acquire`](Semaphore::acquire) and the `try_acquire`
/// family and hold them through a [`SemaphorePermit`]; at no time do live
/// holders hold more permits than the total in force when they took them.
///
/// Every acquisition is leased: renewed by the client's watchdog while its
/// guard lives (or fixed, see
/// [`with_fixed_lease`](Semaphore::with_fixed_lease)), so the permits of a
/// process that dies return when their lease ends.
///
/// A thread that finds too few permits waits without spinning: one thread
/// per process parks on the semaphore's baton list, and a
/// release pushes a token for each waiter the returned permits may serve.
/// Waiting is not first-come first-served between processes, and a waiter
/// asking for many permits can be overtaken by waiters asking for few, but
/// only for a bounded time: a waiter that has waited 100 ms (see
/// [`hold_back_after`](Semaphore::hold_back_after)) reserves the permits it
/// needs, and until it gets them or stops waiting, nobody else takes them.
/// Within a process, waiters queue in arrival order: a waiter that cannot
/// get its permits holds up the threads of its process queued behind it
/// (for the same semaphore) until it gets them or its deadline passes, even
/// if they ask for fewer.
///
/// Cheap to clone, `Send + Sync`: hand clones to threads.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let downloads = client.semaphore("downloads")?;
/// downloads.try_set_permits(4)?; // first writer wins; returns the total in force
///
/// let permit = downloads.acquire()?; // blocks until one of the 4 is free
/// // ... at most 4 downloads run at once, across every process ...
/// permit.release()?; // or drop it
///
/// if let Some(two) = downloads.try_acquire_many_for(2, Duration::from_secs(1))? {
///     assert_eq!(two.num_permits(), 2);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    context: Arc<Context>,
    raw: Arc<dyn RawSemaphore>,
    keys: Arc<SemaphoreKeys>,
    /// The permits' leases, as the watchdog renews them.
    leased: Leased,
    /// `None`: renewed by the watchdog while a guard lives.
    fixed_lease: Option<Duration>,
    /// How long a waiter waits before it reserves the permits it needs.
    hold_back_after: Duration,
}

impl Semaphore {
    pub(crate) fn new(
        context: Arc<Context>,
        raw: Arc<dyn RawSemaphore>,
        keys: SemaphoreKeys,
    ) -> Semaphore {
        let leased = Leased {
            name: keys.name.as_str().into(),
            kind: crate::observe::HoldKind::Permits,
            key: keys.holders.as_str().into(),
            renewer: Arc::clone(&raw) as Arc<dyn RenewLeases>,
        };
        Semaphore {
            context,
            raw,
            keys: Arc::new(keys),
            leased,
            fixed_lease: None,
            hold_back_after: HOLD_BACK_AFTER,
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// A handle on the same semaphore whose permits have a fixed `lease`:
    /// no renewal, the permits return to the semaphore when the lease ends,
    /// even if their guard still lives (it then reports
    /// [`is_lost`](SemaphorePermit::is_lost), and its release
    /// [`Error::PermitsLost`]).
    ///
    /// Without this, permits live as long as their guard: the client's
    /// watchdog renews them every third of the client's default lease, and
    /// the permits of a holder that dies return within one lease.
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
    /// let slots = client.semaphore("render-slots")?.with_fixed_lease(Duration::from_secs(60))?;
    /// let permit = slots.acquire()?; // back in the semaphore after 60 s, whatever happens
    /// # drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<Semaphore, Error> {
        validate_lease(lease)?;
        Ok(Semaphore {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// A handle on the same semaphore whose waiters hold newcomers back
    /// after waiting `after` (100 ms by default).
    ///
    /// Permits go to whoever asks when they are free, so a waiter for
    /// several permits could wait for ever while others keep taking one:
    /// they are rarely all free at once. To bound that, a waiter that has
    /// waited `after` and still finds too few permits reserves the number it
    /// needs: from then until it gets them, gives up, or its process stops
    /// trying, every other caller of any process (waiters, newcomers and
    /// `try_acquire`) takes only permits beyond that number. One waiter
    /// reserves at a time per semaphore, and a waiter for more permits
    /// takes the reservation over from one for fewer; the next one to have
    /// waited long enough reserves once it is served. A shorter `after` is
    /// closer to first-come first-served; [`Duration::MAX`] never reserves
    /// (the fastest for waiters of one permit, but no bound for the
    /// others).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let pool = client.semaphore("gpu")?.hold_back_after(Duration::from_millis(20));
    /// let all = pool.acquire_many(8)?; // overtaken for at most about 20 ms
    /// # drop(all);
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_back_after(&self, after: Duration) -> Semaphore {
        Semaphore {
            hold_back_after: after,
            ..self.clone()
        }
    }

    /// Sets the semaphore's total to `permits`, unless a total is in force
    /// already: the first writer wins, so every process may call this at
    /// start-up with its default. Returns the total in force afterwards
    /// (`permits`, or the one set before). One script call.
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] for 0 or more than 10¹²; Redis failures;
    /// [`Error::WrongType`] when the semaphore's keys hold something else.
    pub fn try_set_permits(&self, permits: u64) -> Result<u64, Error> {
        check_permits(permits)?;
        let reply = self.raw.set_permits(&self.keys, permits)?;
        self.total_from(reply, permits)
    }

    /// Adds `permits` to the total and wakes the waiters they may serve.
    /// Returns the new total. One script call; a call sent twice (its
    /// connection dropped) adds once.
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] for 0, or when the total would pass 10¹²
    /// (it is left as it was); [`Error::SemaphoreNotSet`] before any
    /// [`try_set_permits`](Semaphore::try_set_permits); Redis failures;
    /// [`Error::WrongType`].
    pub fn add_permits(&self, permits: u64) -> Result<u64, Error> {
        self.adjust(Adjust::Add, permits)
    }

    /// Takes `permits` off the total, never below zero, and returns the
    /// new total. Permits already held are not taken back: when more are
    /// held than the new total, none is available until enough holders
    /// release (or their leases end). Waiters that ask for more than the
    /// new total are woken, and get [`Error::PermitsOverCapacity`]. One
    /// script call; a call sent twice reduces once.
    ///
    /// # Errors
    /// As [`add_permits`](Semaphore::add_permits), except that no total is
    /// too small.
    pub fn reduce_permits(&self, permits: u64) -> Result<u64, Error> {
        self.adjust(Adjust::Reduce, permits)
    }

    /// How many permits are available now: the total less what live
    /// holders hold, never above the total (0 while more are held than the
    /// total, after a reduction). One script call, which also returns the
    /// permits of holders whose lease ended; the answer may be stale by the
    /// time it arrives.
    ///
    /// # Errors
    /// [`Error::SemaphoreNotSet`] before any
    /// [`try_set_permits`](Semaphore::try_set_permits); Redis failures;
    /// [`Error::WrongType`].
    pub fn available_permits(&self) -> Result<u64, Error> {
        self.state().map(|(_, available)| available)
    }

    /// The total in force. One script call, as
    /// [`available_permits`](Semaphore::available_permits).
    ///
    /// # Errors
    /// As [`available_permits`](Semaphore::available_permits).
    pub fn total_permits(&self) -> Result<u64, Error> {
        self.state().map(|(total, _)| total)
    }

    /// Blocks until the calling thread holds one permit.
    ///
    /// Uncontended, one script call (plus one `INCR` on a thread's first
    /// call of this client). While no permit is free, the thread waits
    /// without spinning, as described on [`Semaphore`].
    ///
    /// # Errors
    /// [`Error::SemaphoreNotSet`] before any
    /// [`try_set_permits`](Semaphore::try_set_permits);
    /// [`Error::PermitsOverCapacity`] when the total is 0; Redis failures
    /// ([`Error::Unreachable`], [`Error::PoolTimeout`],
    /// [`Error::WrongType`], ...); [`Error::WrongTopology`] on a client of
    /// independent masters. Waiting for permits is never an error.
    pub fn acquire(&self) -> Result<SemaphorePermit, Error> {
        self.acquire_many(1)
    }

    /// Blocks until the calling thread holds `permits` permits at once, in
    /// one guard.
    ///
    /// The waiter is woken when a release (or an addition, or a lease
    /// ending) may have made `permits` available, and tries again.
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire); [`Error::InvalidPermits`] for 0
    /// or more than 10¹²; [`Error::PermitsOverCapacity`], before any wait,
    /// for more than the total (or during the wait, when a reduction
    /// brings the total below `permits`).
    pub fn acquire_many(&self, permits: u64) -> Result<SemaphorePermit, Error> {
        check_permits(permits)?;
        loop {
            if let Some(permit) = self.acquire_until(permits, None)? {
                return Ok(permit);
            }
        }
    }

    /// One attempt at one permit: the guard if one was free, `None` if
    /// not. Never waits. One script call.
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire).
    pub fn try_acquire(&self) -> Result<Option<SemaphorePermit>, Error> {
        self.try_acquire_many(1)
    }

    /// One attempt at `permits` permits at once.
    ///
    /// # Errors
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn try_acquire_many(&self, permits: u64) -> Result<Option<SemaphorePermit>, Error> {
        check_permits(permits)?;
        let start = self.context.observer().is_set().then(Instant::now);
        let identity = self
            .context
            .identity()
            .map_err(|err| self.failed(start, err))?;
        let attempt = self.attempt(&identity, permits, None, false, false, None);
        match attempt.map_err(|err| self.failed(start, err))? {
            Tried::Acquired(permit) => Ok(Some(permit.announced(start, Acquisition::FirstAttempt))),
            Tried::Short { .. } => Ok(None),
        }
    }

    /// Like [`acquire`](Semaphore::acquire), but gives up after `timeout`
    /// and returns `None`. A timeout too large to be a point in time means
    /// no deadline.
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire).
    pub fn try_acquire_for(&self, timeout: Duration) -> Result<Option<SemaphorePermit>, Error> {
        self.try_acquire_many_for(1, timeout)
    }

    /// Like [`acquire_many`](Semaphore::acquire_many), but gives up after
    /// `timeout` and returns `None`.
    ///
    /// # Errors
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn try_acquire_many_for(
        &self,
        permits: u64,
        timeout: Duration,
    ) -> Result<Option<SemaphorePermit>, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_acquire_many_until(permits, deadline),
            None => self.acquire_many(permits).map(Some),
        }
    }

    /// Like [`acquire`](Semaphore::acquire), but gives up at `deadline` and
    /// returns `None`. A waiter that was just woken makes its one attempt
    /// even if the deadline passed meanwhile, and returns the guard if that
    /// attempt wins.
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire).
    pub fn try_acquire_until(&self, deadline: Instant) -> Result<Option<SemaphorePermit>, Error> {
        self.try_acquire_many_until(1, deadline)
    }

    /// Like [`acquire_many`](Semaphore::acquire_many), but gives up at
    /// `deadline` and returns `None`.
    ///
    /// # Errors
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn try_acquire_many_until(
        &self,
        permits: u64,
        deadline: Instant,
    ) -> Result<Option<SemaphorePermit>, Error> {
        check_permits(permits)?;
        self.acquire_until(permits, Some(deadline))
    }

    fn adjust(&self, way: Adjust, permits: u64) -> Result<u64, Error> {
        check_permits(permits)?;
        let context = &self.context;
        let request = format!(
            "{}:{}",
            context.identities.instance(),
            context.next_request()
        );
        let reply = self.raw.adjust(&self.keys, way, permits, &request)?;
        match reply {
            TotalReply::Refused(Refusal::OverCapacity { total }) => Err(Error::InvalidPermits {
                permits: total.saturating_add(permits),
            }),
            reply => self.total_from(reply, permits),
        }
    }

    fn total_from(&self, reply: TotalReply, permits: u64) -> Result<u64, Error> {
        match reply {
            TotalReply::Total { total, .. } => Ok(total),
            TotalReply::Refused(refusal) => Err(raw::refused(&self.keys, refusal, permits)),
        }
    }

    /// The total and the available permits.
    fn state(&self) -> Result<(u64, u64), Error> {
        match self.raw.state(&self.keys)? {
            StateReply::State { total, available } => Ok((total, available)),
            StateReply::Refused(refusal) => Err(raw::refused(&self.keys, refusal, 0)),
        }
    }

    /// The first attempt, then the wait until `deadline`.
    fn acquire_until(
        &self,
        permits: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<SemaphorePermit>, Error> {
        let since = Instant::now();
        let start = self.context.observer().is_set().then_some(since);
        let acquired = self.first_then_wait(permits, deadline, since, start)?;
        Ok(acquired.map(|(permit, how)| permit.announced(start, how)))
    }

    /// [`acquire_until`](Semaphore::acquire_until)'s work: the permit, and
    /// how it was got. `since`: when the caller started; once it has waited
    /// [`hold_back_after`](Semaphore::hold_back_after), its attempts reserve
    /// the permits it needs. `start`: the same, if a hook was set then.
    fn first_then_wait(
        &self,
        permits: u64,
        deadline: Option<Instant>,
        since: Instant,
        start: Option<Instant>,
    ) -> Result<Option<(SemaphorePermit, Acquisition)>, Error> {
        let context = &self.context;
        let identity =
            parking::ride_out(deadline, context.config.io_timeout, || context.identity())
                .map_err(|err| self.failed(start, err))?;
        let place = format!("{permits}:{identity}");
        // Whether an attempt may have left this thread a place among the
        // waiters, which it must give up if it stops waiting unserved.
        let placed = Cell::new(false);
        // Whether an attempt may have made this thread's place the one that
        // holds newcomers back: if it gives up, those are woken.
        let reserved = Cell::new(false);
        // The waiter takes the baton in its attempt after a park the
        // list's change ended (see `ParkHow::claims`).
        let takes_token = Cell::new(false);
        // A waiter parked on its client's hub may be granted its permits
        // by a release (see `release.lua`), from its first attempt on.
        let grantable = grants::grant_lease(self.mode())
            .filter(|_| context.backend.takes_grants())
            .map(|lease| (Grantable::default(), lease));
        let attempt = || {
            if let Some((grantable, _)) = &grantable {
                if let Some(permit) = self.take_grant(&identity, permits, grantable) {
                    return Ok(Attempt::Acquired(permit));
                }
            }
            placed.set(true);
            let waited = since.elapsed();
            let claim = waited >= self.hold_back_after;
            reserved.set(reserved.get() || claim);
            let tried = self.attempt(
                &identity,
                permits,
                Some(&place),
                claim,
                takes_token.take(),
                grantable.as_ref().map(|(g, lease)| (g, *lease)),
            );
            let (lease_left, reserving, passed_on) = match tried? {
                Tried::Acquired(permit) => return Ok(Attempt::Acquired(permit)),
                Tried::Short {
                    lease_left,
                    reserving,
                    passed_on,
                } => (lease_left, reserving, passed_on),
            };
            let until_claim = self.hold_back_after.saturating_sub(waited);
            // Back when it may reserve, not at the end of a long park: a
            // waiter for many permits is woken only when they are all free,
            // which may be never until it reserves them.
            let lease_left = if !claim && until_claim < context.config.max_park {
                Some(lease_left.map_or(until_claim, |left| left.min(until_claim)))
            } else {
                lease_left
            };
            Ok::<_, Error>(Attempt::Held {
                lease_left,
                handing_over: false,
                // Its token goes on the reserved baton while its place
                // holds newcomers back, where no waiter that cannot use it
                // pops it first.
                park_on: reserving.then(|| ParkOn {
                    list: self.keys.reserved_baton.clone(),
                    claims: false,
                }),
                // The tokens it passed on are for others: it leaves them
                // to them rather than take them back first (its own token
                // comes on the reserved baton, if it parks there).
                passed_on: passed_on && !reserving,
            })
        };
        // A newcomer queues behind waiting threads of this process instead
        // of trying first, so that they are served in order. What its
        // first attempt found (it took the waiter's place, as the wait's
        // would) is what the wait parks on at once.
        let mut first = None;
        if !context.room.has_waiters(&self.keys.baton) {
            match attempt() {
                Ok(Attempt::Acquired(permit)) => {
                    return Ok(Some((permit, Acquisition::FirstAttempt)))
                }
                Ok(held @ Attempt::Held { .. }) => first = Some(held),
                Err(err) if err.is_transient() => {
                    log::debug!("redbaton: first attempt on {:?} failed: {err}", self.name());
                }
                Err(err) => return Err(self.failed(start, self.gave_up(&place, false, false, err))),
            }
        }
        let waited = context.room.wait_until(
            &self.keys.name,
            &self.keys.baton,
            None,
            (),
            deadline,
            Some(&takes_token),
            grantable.as_ref().map(|(g, _)| &g.slot),
            first,
            attempt,
        );
        match waited {
            Ok(Waited::Acquired(permit)) => Ok(Some((permit, Acquisition::AfterWaiting))),
            // Nobody hands permits over locally: a grant is only a reason
            // to look again.
            Ok(Waited::Granted(())) => {
                self.leave(&place, placed.get(), reserved.get());
                self.first_then_wait(permits, deadline, since, start)
            }
            Ok(Waited::TimedOut) => {
                self.leave(&place, placed.get(), reserved.get());
                Ok(None)
            }
            Err(err) => Err(self.gave_up(&place, placed.get(), reserved.get(), err)),
        }
    }

    /// Gives up this thread's place among the waiters, if it may have one
    /// (the script removes it itself on success and on over-capacity).
    /// A place that may have held newcomers back is followed by a look at
    /// the state, which drops the reservation and wakes the waiters it held
    /// back. Best effort: a place left behind ends by itself, and its
    /// reservation with it.
    fn leave(&self, place: &str, placed: bool, reserved: bool) {
        if !placed {
            return;
        }
        let left = self.raw.leave(&self.keys, place).and_then(|()| {
            if reserved {
                self.raw.state(&self.keys)?;
            }
            Ok(())
        });
        if let Err(err) = left {
            log::debug!(
                "redbaton: could not give up a waiting place on {:?}: {err}",
                self.name()
            );
        }
    }

    /// Leaves the wait with `err`.
    fn gave_up(&self, place: &str, placed: bool, reserved: bool, err: Error) -> Error {
        if !matches!(
            err,
            Error::PermitsOverCapacity { .. } | Error::WrongTopology { .. }
        ) {
            self.leave(place, placed, reserved);
        }
        err
    }

    /// Tells the event hook that an acquisition that started at `start`
    /// (`None`: no hook was set then) failed before any wait with `err`;
    /// returns `err`. A wait that fails is told by the wait core.
    fn failed(&self, start: Option<Instant>, err: Error) -> Error {
        self.context
            .observer()
            .acquire_failed(&self.keys.name, HoldKind::Permits, start);
        err
    }

    /// How this handle's acquisitions keep their permits.
    fn mode(&self) -> LeaseMode {
        match self.fixed_lease {
            Some(lease) => LeaseMode::Fixed(lease),
            None => LeaseMode::Renewed(self.context.config.default_lease),
        }
    }

    /// The permit a release granted this waiter while it was parked, if
    /// one did.
    ///
    /// The grant's lease is counted from the sending of the attempt the
    /// waiter's park followed (no later moment is known to precede the
    /// grant), and may be shorter than the waiter's own: the permit is
    /// recorded as if sent that much earlier, so that it counts the
    /// grant's lease, and its first renewal is due at once, which
    /// lengthens it. A grant that came long after that attempt (the
    /// waiter parked through a long hold) could have little left by that
    /// count: the waiter renews it first, one call, and counts the lease
    /// from the renewal (`None` if the renewal found it gone, or failed:
    /// the waiter asks again; the permits return with the grant's lease).
    fn take_grant(
        &self,
        identity: &Arc<str>,
        permits: u64,
        grantable: &Grantable,
    ) -> Option<SemaphorePermit> {
        let (taken, fresh) = match grantable.take()? {
            Ok(taken) => (taken, true),
            Err(late) => (late, false),
        };
        let id: Arc<str> = format!("{identity}:{}", taken.mark.request).into();
        let mode = self.mode();
        let counted = taken.counted_from(mode, self.raw.clock_margin(taken.mark.lease));
        let sent = match counted.filter(|_| fresh) {
            Some(sent) => sent,
            None => self.confirm_late_grant(&id, mode)?,
        };
        Some(self.permit(id, permits, mode, sent))
    }

    /// Renews the permits a late grant gave `id` for `mode`'s lease: when
    /// the renewal was sent, if they were still its own. A renewal that
    /// failed may have run: the permits are returned in the background, as
    /// after an acquisition whose reply was lost.
    fn confirm_late_grant(&self, id: &Arc<str>, mode: LeaseMode) -> Option<Instant> {
        let sent = Instant::now();
        match self.raw.renew(&self.keys, id, mode.lease()) {
            Ok(true) => Some(earlier(sent, self.raw.clock_margin(mode.lease()))),
            Ok(false) => None,
            Err(err) => {
                log::debug!(
                    "redbaton: confirming a late grant of {:?} failed: {err}",
                    self.name()
                );
                let cleanup = raw::release_later(&self.raw, &self.keys, id, mode.lease(), sent);
                self.context.finish_later(cleanup);
                None
            }
        }
    }

    /// The guard of permits taken under `id` by an acquisition (or, for a
    /// grant, the attempt it followed) sent at `sent`.
    fn permit(
        &self,
        id: Arc<str>,
        permits: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> SemaphorePermit {
        let context = &self.context;
        let (status, mode) = context.enter(&self.leased, &id, 0, mode, sent);
        let held = Held {
            id,
            permits,
            mode,
            status,
        };
        SemaphorePermit::new(
            Arc::clone(context),
            Arc::clone(&self.raw),
            Arc::clone(&self.keys),
            held,
        )
    }

    /// One run of the acquire script for `permits` under a new permit id;
    /// `place` for a caller that waits; `grantable`: a waiter that may be
    /// granted its permits while parked, with the grant's lease, whose
    /// park after this attempt carries the attempt's ticket.
    fn attempt(
        &self,
        identity: &Arc<str>,
        permits: u64,
        place: Option<&str>,
        claim: bool,
        takes_token: bool,
        grantable: Option<(&Grantable, Duration)>,
    ) -> Result<Tried, Error> {
        let context = &self.context;
        let request = context.next_request();
        let id: Arc<str> = format!("{identity}:{request}").into();
        let mode = self.mode();
        let args = AcquireArgs {
            id: &id,
            permits,
            lease: mode.lease(),
            place,
            // A place outlives the longest park and the next attempt's
            // round trip.
            place_ttl: context.config.max_park + context.config.io_timeout,
            // A waiter comes back at least every `max_park`: one that died
            // holds others back about one and a half park slices, as a dead
            // waiter holds up a fair lock's queue.
            reserve_for: claim.then(|| context.config.place_ttl()),
            takes_token,
            grantable: grantable
                .filter(|_| place.is_some())
                .map(|(_, lease)| (request, lease)),
        };
        let sent = Instant::now();
        match self.raw.attempt(&self.keys, args) {
            Ok(AcquireReply::Acquired { .. }) => {
                Ok(Tried::Acquired(self.permit(id, permits, mode, sent)))
            }
            Ok(AcquireReply::Short {
                lease_left,
                reserving,
                passed_on,
                ..
            }) => {
                if let (Some((grantable, lease)), Some(_)) = (grantable, args.grantable) {
                    // The spec this attempt left names this request: a
                    // grant for it comes after it was sent.
                    let mark = Mark {
                        sent,
                        lease,
                        request,
                    };
                    grantable.mark(backend::ticket(identity, request), mark);
                }
                Ok(Tried::Short {
                    lease_left,
                    reserving,
                    passed_on,
                })
            }
            Ok(AcquireReply::Refused(refusal)) => Err(raw::refused(&self.keys, refusal, permits)),
            Err(failed) => {
                if failed.outcome_unknown {
                    // The script may have run and taken permits for a guard
                    // that will never exist: return them once Redis answers.
                    let cleanup =
                        raw::release_later(&self.raw, &self.keys, &id, mode.lease(), sent);
                    context.finish_later(cleanup);
                }
                Err(failed.error)
            }
        }
    }
}

/// What one attempt at permits found.
enum Tried {
    /// The permits.
    Acquired(SemaphorePermit),
    /// Too few free; the first holder's lease ends in `lease_left` (`None`:
    /// no holder). `reserving`: the caller's place holds newcomers back.
    /// `passed_on`: it pushed tokens for other waiters.
    Short {
        lease_left: Option<Duration>,
        reserving: bool,
        passed_on: bool,
    },
}

/// Checks a permit count: at least 1, at most 10¹².
fn check_permits(permits: u64) -> Result<(), Error> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::InvalidPermits { permits });
    }
    Ok(())
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.keys.name)
            .field("state_key", &self.keys.state)
            .field("fixed_lease", &self.fixed_lease)
            .finish_non_exhaustive()
    }
}

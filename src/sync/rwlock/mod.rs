//! The read-write lock: [`RwLock`] (the handle on one name, and the ways to
//! read or write under it), the upgradable read (`upgradable.rs`: its
//! handle methods, its guard, and the upgrade), the read and write guards
//! (`guard.rs`), and the Redis protocol under all of them (`raw.rs`).
//! Imports run one way: handle (`mod.rs`, `upgradable.rs`) → guard → raw.
//! The upgradable guard keeps a clone of its handle, since it upgrades
//! through it; the read and write guards know no handle.
//!
//! Readers share the lock, a writer has it alone, and one upgradable
//! reader at a time shares it with readers and keeps writers out.
//! Writer-preferring: once a writer waits (it keeps a place in Redis,
//! renewed at each of its attempts), fresh readers queue behind it, so a
//! stream of readers cannot starve writers; a reader already holding may
//! re-enter. An upgrade that waits holds fresh readers back the same way
//! (a mark on the upgradable hold). No local hand-off: waiting threads of
//! one process share one parked connection per baton (readers, writers,
//! upgradable readers, the upgrade) through the client's plain waiting
//! room.

mod guard;
mod raw;
mod upgradable;

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{self, Unclaimed};
use crate::config::validate_lease;
use crate::context::Context;
use crate::error::Error;
use crate::keys::RwKeys;
use crate::lease::{LeaseMode, Leased, RenewLeases};
use crate::observe::{Acquisition, HoldKind};
use crate::parking::{self, Attempt, Waited};
use crate::scripts::rwlock::{
    self as calls, ReadArgs, ReadAsking, RwAcquireReply, WriteArgs, WriteGrants,
};

use super::grants::{self, GiveBackSettings, Grantable, Mark};

pub use guard::{ReadGuard, WriteGuard};
pub use upgradable::UpgradableReadGuard;

use guard::Hold;
use raw::{Kind, RawRwLock, RwRenewer};

/// A handle on one distributed read-write lock, made by
/// [`Client::rw_lock`].
///
/// Any number of threads (of any processes) may hold it for reading at
/// once; a writer holds it alone. Cheap to clone, `Send + Sync`. Every
/// mode is re-entrant per thread, and a thread that writes may also take
/// read guards (a downgrade: once its write guards are gone, it still
/// reads). A thread that only reads may not ask to write: that is
/// [`Error::UpgradeRefused`], at once, instead of a deadlock.
///
/// **Upgradable read** ([`upgradable_read`](RwLock::upgradable_read)):
/// one thread at a time may hold it, beside any number of readers; no
/// writer gets in meanwhile. Its holder may
/// [`upgrade`](UpgradableReadGuard::upgrade) to the write hold: it waits
/// for the readers to leave, and no writer can get in between, because
/// the upgradable hold stays until the write hold is taken.
///
/// **Writer-preferring.** Once a writer waits, fresh readers wait behind
/// it, so that readers coming and going cannot keep a writer out forever.
/// A waiting writer that dies stops holding readers back within one
/// maximum park time; one that gives up, at once. A steady stream of
/// writers can keep readers waiting.
///
/// Every hold has a lease, renewed by the client's watchdog (or fixed,
/// with [`with_fixed_lease`](RwLock::with_fixed_lease)): a reader or
/// writer that dies frees its part when its lease ends.
///
/// [`Client::rw_lock`]: crate::Client::rw_lock
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let config = client.rw_lock("config:pricing")?;
///
/// let reading = config.read()?; // shared with other readers
/// // ... read the configuration ...
/// reading.unlock()?;
///
/// let writing = config.write()?; // alone
/// let token = writing.fencing_token(); // pass to storage that checks it
/// // ... write the configuration ...
/// writing.unlock()?;
/// # let _ = token;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    context: Arc<Context>,
    raw: Arc<RawRwLock>,
    keys: Arc<RwKeys>,
    /// A read hold's lease lives on the readers set, a write hold's on the
    /// write key; each is renewed by its kind's renewer.
    read_leased: Leased,
    upgradable_leased: Leased,
    write_leased: Leased,
    /// `None`: renewed by the watchdog while a guard lives.
    fixed_lease: Option<Duration>,
}

/// The read-write lock's protocol and its renewers, one per client, so
/// that the watchdog renews the holds of every read-write lock of the
/// client in one round per kind.
#[derive(Debug)]
pub(crate) struct RwProtocol {
    raw: Arc<RawRwLock>,
    read: Arc<dyn RenewLeases>,
    upgradable: Arc<dyn RenewLeases>,
    write: Arc<dyn RenewLeases>,
}

impl RwProtocol {
    pub(crate) fn new(context: &Context) -> Self {
        let raw = Arc::new(RawRwLock::new(
            Arc::clone(&context.backend),
            &context.config,
        ));
        let renewer = |kind| {
            Arc::new(RwRenewer {
                raw: Arc::clone(&raw),
                kind,
            }) as Arc<dyn RenewLeases>
        };
        RwProtocol {
            read: renewer(Kind::Read),
            upgradable: renewer(Kind::Upgradable),
            write: renewer(Kind::Write),
            raw,
        }
    }
}

impl RwLock {
    pub(crate) fn new(context: Arc<Context>, protocol: &RwProtocol, keys: RwKeys) -> RwLock {
        let leased = |kind, key: &str, renewer: &Arc<dyn RenewLeases>| Leased {
            name: keys.name.as_str().into(),
            kind,
            key: key.into(),
            renewer: Arc::clone(renewer),
        };
        let read_leased = leased(HoldKind::Read, &keys.readers, &protocol.read);
        let upgradable_leased =
            leased(HoldKind::Upgradable, &keys.upgradable, &protocol.upgradable);
        let write_leased = leased(HoldKind::Write, &keys.write, &protocol.write);
        RwLock {
            context,
            raw: Arc::clone(&protocol.raw),
            keys: Arc::new(keys),
            read_leased,
            upgradable_leased,
            write_leased,
            fixed_lease: None,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// A handle on the same lock whose acquisitions (read and write) have a
    /// fixed `lease`: no renewal; a hold ends when its lease does, even if
    /// its guard still lives (the guard then reports `is_lost`). As with
    /// [`Lock::with_fixed_lease`](crate::Lock::with_fixed_lease), the mode
    /// belongs to the hold: re-entry joins a hold as it is.
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
    /// let lock = client.rw_lock("catalog")?.with_fixed_lease(Duration::from_secs(60))?;
    /// let guard = lock.write()?; // gone after 60 s, whatever happens
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<RwLock, Error> {
        validate_lease(lease)?;
        Ok(RwLock {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// Blocks until the calling thread holds the lock for reading.
    ///
    /// While a writer holds it, or waits for it, the thread waits without
    /// spinning: in a `BLPOP` on the lock's read baton until the writer
    /// releases (or gives up), or its lease (or its place) ends; one
    /// thread per process parks in Redis, the others wait locally. On one
    /// server (or Sentinel's master without `replica_acks`), the writer's
    /// last release grants the read to the parked thread itself, where no
    /// writer waits: it wakes holding it.
    /// Uncontended, this is one script call (plus one `INCR` on a thread's
    /// first call).
    ///
    /// # Errors
    /// Redis failures ([`Error::Unreachable`], [`Error::PoolTimeout`],
    /// [`Error::WrongType`], [`Error::Redis`]);
    /// [`Error::WrongTopology`] on a quorum of masters. Contention is never
    /// an error.
    pub fn read(&self) -> Result<ReadGuard, Error> {
        loop {
            if let Some(guard) = self.acquire_read(None)? {
                return Ok(guard);
            }
        }
    }

    /// One attempt to read: the guard if no writer holds or waits (or the
    /// thread already reads, or writes), `None` otherwise. Never waits.
    /// One script call.
    ///
    /// # Errors
    /// As [`read`](RwLock::read).
    pub fn try_read(&self) -> Result<Option<ReadGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let failed = |err| self.failed(start, HoldKind::Read, err);
        let identity = self.context.identity().map_err(failed)?;
        match self.attempt_read_once(&identity).map_err(failed)? {
            Attempt::Acquired(guard) => Ok(Some(guard.announced(start, Acquisition::FirstAttempt))),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Like [`read`](RwLock::read), but gives up after `timeout` and
    /// returns `None`. A timeout too large to be a point in time means no
    /// deadline.
    ///
    /// # Errors
    /// As [`read`](RwLock::read).
    pub fn try_read_for(&self, timeout: Duration) -> Result<Option<ReadGuard>, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_read_until(deadline),
            None => self.read().map(Some),
        }
    }

    /// Like [`read`](RwLock::read), but gives up at `deadline` and returns
    /// `None`.
    ///
    /// # Errors
    /// As [`read`](RwLock::read).
    pub fn try_read_until(&self, deadline: Instant) -> Result<Option<ReadGuard>, Error> {
        self.acquire_read(Some(deadline))
    }

    /// Blocks until the calling thread holds the lock for writing: no
    /// other thread reads or writes.
    ///
    /// While others hold it, the writer keeps a place in Redis (renewed at
    /// each of its attempts, at least once per maximum park time) that
    /// makes fresh readers wait, and parks in a `BLPOP` on the write baton
    /// until the last reader or the writer releases, or their leases end.
    /// On one server (or Sentinel's master without `replica_acks`), that
    /// release grants the write hold to the first waiting writer itself,
    /// when it is a thread parked on its client's hub: it wakes holding it.
    /// Uncontended, this is one script call.
    ///
    /// The thread that holds the upgradable read upgrades: this is
    /// [`UpgradableReadGuard::upgrade`].
    ///
    /// # Errors
    /// [`Error::UpgradeRefused`] when the calling thread holds the lock
    /// for reading only (found locally, before any network call: waiting
    /// would deadlock); otherwise as [`read`](RwLock::read).
    pub fn write(&self) -> Result<WriteGuard, Error> {
        loop {
            if let Some(guard) = self.acquire_write(None)? {
                return Ok(guard);
            }
        }
    }

    /// One attempt to write: the guard if nobody else reads or writes,
    /// `None` otherwise. Never waits, and keeps no place among the waiting
    /// writers. One script call.
    ///
    /// # Errors
    /// As [`write`](RwLock::write).
    pub fn try_write(&self) -> Result<Option<WriteGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let failed = |err| self.failed(start, HoldKind::Write, err);
        let identity = self.context.identity().map_err(failed)?;
        match self
            .attempt_write(&identity, false, false)
            .map_err(failed)?
        {
            Attempt::Acquired(guard) => Ok(Some(guard.announced(start, Acquisition::FirstAttempt))),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Like [`write`](RwLock::write), but gives up after `timeout` and
    /// returns `None`. A timeout too large to be a point in time means no
    /// deadline.
    ///
    /// # Errors
    /// As [`write`](RwLock::write).
    pub fn try_write_for(&self, timeout: Duration) -> Result<Option<WriteGuard>, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_write_until(deadline),
            None => self.write().map(Some),
        }
    }

    /// Like [`write`](RwLock::write), but gives up at `deadline` and
    /// returns `None`. A writer that gives up leaves its place at once (one
    /// more script call), so readers it held back go on.
    ///
    /// # Errors
    /// As [`write`](RwLock::write).
    pub fn try_write_until(&self, deadline: Instant) -> Result<Option<WriteGuard>, Error> {
        self.acquire_write(Some(deadline))
    }

    /// Tells the event hook that an acquisition of `kind` that started at
    /// `start` (`None`: no hook was set then) failed before any wait with
    /// `err`; returns `err`. A wait that fails is told by the wait core.
    fn failed(&self, start: Option<Instant>, kind: HoldKind, err: Error) -> Error {
        self.context
            .observer()
            .acquire_failed(&self.keys.name, kind, start);
        err
    }

    /// The first read attempt, then the wait loop until `deadline`.
    fn acquire_read(&self, deadline: Option<Instant>) -> Result<Option<ReadGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let acquired = self.first_read_then_wait(deadline, start)?;
        Ok(acquired.map(|(guard, how)| guard.announced(start, how)))
    }

    /// [`acquire_read`](RwLock::acquire_read)'s work: the guard, and how
    /// it was got.
    fn first_read_then_wait(
        &self,
        deadline: Option<Instant>,
        start: Option<Instant>,
    ) -> Result<Option<(ReadGuard, Acquisition)>, Error> {
        let context = &self.context;
        let identity =
            parking::ride_out(deadline, context.config.io_timeout, || context.identity())
                .map_err(|err| self.failed(start, HoldKind::Read, err))?;
        // A newcomer queues behind this process's waiting readers; a
        // reader re-entering never queues, nor does the writer or the
        // upgradable reader (those readers may be waiting for its write or
        // upgrade to end).
        let holds = [Kind::Read, Kind::Write, Kind::Upgradable]
            .into_iter()
            .any(|kind| self.holds(kind, &identity));
        // A waiter parked on its client's hub may be granted the read by a
        // writer's last release (see `release_write.lua`): its attempts
        // leave a spec when a writer refuses them (the first too, so that
        // no refusal of this waiter asks for a read baton as well).
        let grantable = grants::grant_lease(self.mode())
            .filter(|_| !holds && self.raw.takes_grants())
            .map(|lease| (Grantable::default(), lease));
        if holds || !context.room.has_waiters(&self.keys.read_baton) {
            let first = grantable.as_ref().map(|(g, lease)| (g, *lease));
            match self.attempt_read_granted(&identity, ReadAsking::First, false, first) {
                Ok(Attempt::Acquired(guard)) => {
                    return Ok(Some((guard, Acquisition::FirstAttempt)))
                }
                Ok(Attempt::Held { .. }) => {}
                Err(err) if err.is_transient() => {
                    log::debug!(
                        "redbaton: first read attempt on {:?} failed: {err}",
                        self.name()
                    );
                }
                Err(err) => return Err(self.failed(start, HoldKind::Read, err)),
            }
        }
        // The waiter takes the read baton in its attempt after a park the
        // list's change ended (see `ParkHow::claims`).
        let takes_token = Cell::new(false);
        let attempt = || {
            if let Some((grantable, _)) = &grantable {
                if let Some(hold) = self.take_grant(Kind::Read, &identity, grantable) {
                    return Ok(Attempt::Acquired(ReadGuard::new(hold)));
                }
            }
            let grantable = grantable.as_ref().map(|(g, lease)| (g, *lease));
            self.attempt_read_granted(&identity, ReadAsking::Waited, takes_token.take(), grantable)
        };
        loop {
            let waited = context.room.wait_until(
                &self.keys.name,
                &self.keys.read_baton,
                None,
                (),
                deadline,
                Some(&takes_token),
                grantable.as_ref().map(|(g, _)| &g.slot),
                None,
                attempt,
            );
            match waited {
                Ok(Waited::Acquired(guard)) => return Ok(Some((guard, Acquisition::AfterWaiting))),
                Ok(Waited::TimedOut) => {
                    self.withdraw_read_spec(&identity, grantable.as_ref().map(|(g, _)| g));
                    return Ok(None);
                }
                // Nothing is handed over locally in this room.
                Ok(Waited::Granted(())) => {}
                Err(err) => {
                    self.withdraw_read_spec(&identity, grantable.as_ref().map(|(g, _)| g));
                    return Err(err);
                }
            }
        }
    }

    /// The first write attempt, then the wait loop until `deadline`; a
    /// writer that gives up leaves its place.
    fn acquire_write(&self, deadline: Option<Instant>) -> Result<Option<WriteGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let acquired = self.first_write_then_wait(deadline, start)?;
        Ok(acquired.map(|(guard, how)| guard.announced(start, how)))
    }

    /// [`acquire_write`](RwLock::acquire_write)'s work: the guard, and how
    /// it was got.
    fn first_write_then_wait(
        &self,
        deadline: Option<Instant>,
        start: Option<Instant>,
    ) -> Result<Option<(WriteGuard, Acquisition)>, Error> {
        let context = &self.context;
        let failed = |err| self.failed(start, HoldKind::Write, err);
        let identity =
            parking::ride_out(deadline, context.config.io_timeout, || context.identity())
                .map_err(failed)?;
        self.refuse_upgrade(&identity).map_err(failed)?;
        let holds = self.holds(Kind::Write, &identity);
        if !holds && self.holds(Kind::Upgradable, &identity) {
            return self.upgrade_then_wait(&identity, deadline, start);
        }
        // A waiter parked on its client's hub may be granted the write hold
        // by a release (see `lib/write_grant.lua`): the attempts that keep
        // its place leave a spec (the first too, so that its park may be
        // ended by a grant from the start).
        let grantable = grants::grant_lease(self.mode())
            .filter(|_| !holds && self.raw.takes_grants())
            .map(|lease| (Grantable::default(), lease));
        let grantable = grantable.as_ref().map(|(g, lease)| (g, *lease));
        // Whether this writer may have a place to leave when it gives up.
        let mut placed = false;
        // What a first attempt that took the writer's place found, for the
        // wait to park on at once (its own first attempt would be the same).
        let mut first = None;
        if holds || !context.room.has_waiters(&self.keys.write_baton) {
            // A writer that will wait takes its place with this attempt.
            let queue = deadline.is_none_or(|deadline| deadline > Instant::now());
            placed = queue;
            match self.attempt_write_granted(&identity, queue, false, grantable) {
                Ok(Attempt::Acquired(guard)) => {
                    return Ok(Some((guard, Acquisition::FirstAttempt)))
                }
                Ok(held @ Attempt::Held { .. }) => first = queue.then_some(held),
                Err(err) if err.is_transient() => {
                    log::debug!(
                        "redbaton: first write attempt on {:?} failed: {err}",
                        self.name()
                    );
                }
                Err(err) => return Err(failed(err)),
            }
        }
        // The waiter takes the write baton in its attempt after a park
        // the list's change ended (see `ParkHow::claims`).
        let takes_token = Cell::new(false);
        let waited = loop {
            let waited = context.room.wait_until(
                &self.keys.name,
                &self.keys.write_baton,
                None,
                (),
                deadline,
                Some(&takes_token),
                grantable.map(|(g, _)| &g.slot),
                first.take(),
                || {
                    if let Some((grantable, _)) = grantable {
                        if let Some(hold) = self.take_grant(Kind::Write, &identity, grantable) {
                            return Ok(Attempt::Acquired(WriteGuard::new(hold)));
                        }
                    }
                    placed = true;
                    self.attempt_write_granted(&identity, true, takes_token.take(), grantable)
                },
            );
            match waited {
                Ok(Waited::Granted(())) => {}
                other => break other,
            }
        };
        match waited {
            Ok(Waited::Acquired(guard)) => Ok(Some((guard, Acquisition::AfterWaiting))),
            other => {
                if placed {
                    // Best effort: a place left behind ends by itself
                    // within one park time, its spec with it (a grant
                    // by it would be given back).
                    if let Err(err) = self.raw.withdraw(&self.keys, &identity) {
                        log::debug!(
                            "redbaton: leaving the writers' queue of {:?} failed: {err}",
                            self.name()
                        );
                    }
                }
                other.map(|_| None)
            }
        }
    }

    /// Whether `identity` holds this lock in `kind` through live guards.
    fn holds(&self, kind: Kind, identity: &Arc<str>) -> bool {
        self.held(kind, identity).is_some()
    }

    /// The token, live guards and lease mode of `identity`'s hold of
    /// `kind`, if it has one.
    fn held(&self, kind: Kind, identity: &Arc<str>) -> Option<(u64, usize, LeaseMode)> {
        let key = match kind {
            Kind::Read => &self.keys.readers,
            Kind::Upgradable => &self.keys.upgradable,
            Kind::Write => &self.keys.write,
        };
        let held = self.context.leases.registry.held(key, identity)?;
        Some((held.fence, held.guards, held.mode))
    }

    /// A thread that reads without writing or holding the upgradable read
    /// may not ask to write, nor for the upgradable read: it would wait
    /// for its own read hold (behind a waiting writer, or an upgrade).
    fn refuse_upgrade(&self, identity: &Arc<str>) -> Result<(), Error> {
        if self.holds(Kind::Read, identity)
            && !self.holds(Kind::Write, identity)
            && !self.holds(Kind::Upgradable, identity)
        {
            return Err(self.upgrade_refused());
        }
        Ok(())
    }

    fn upgrade_refused(&self) -> Error {
        Error::UpgradeRefused {
            name: self.keys.name.clone(),
        }
    }

    /// How this handle's fresh acquisitions keep their hold alive.
    fn mode(&self) -> LeaseMode {
        match self.fixed_lease {
            Some(lease) => LeaseMode::Fixed(lease),
            None => LeaseMode::Renewed(self.context.config.default_lease),
        }
    }

    /// One run of the read script by a caller that will not wait if
    /// refused (`try_read`).
    fn attempt_read_once(&self, identity: &Arc<str>) -> Result<Attempt<ReadGuard>, Error> {
        self.attempt_read_granted(identity, ReadAsking::Once, false, None)
    }

    /// One run of the read script, asking as `asking` (from the wait loop
    /// it passes a read baton on); `takes_token`: it pops the read baton
    /// first (see `ParkHow::claims`). By a waiter that may be granted the
    /// read while parked (`grantable`, with the grant's lease), a refusal
    /// by a holding writer leaves its spec, and its park after this
    /// attempt carries the attempt's ticket.
    fn attempt_read_granted(
        &self,
        identity: &Arc<str>,
        asking: ReadAsking,
        takes_token: bool,
        grantable: Option<(&Grantable, Duration)>,
    ) -> Result<Attempt<ReadGuard>, Error> {
        let held = self.held(Kind::Read, identity);
        let (held_token, guards, mode) = held.unwrap_or((0, 0, self.mode()));
        let request = self.context.next_request();
        let args = ReadArgs {
            identity,
            lease: mode.lease(),
            held_token,
            depth: guards + 1,
            request,
            asking,
            baton_ttl: self.raw.baton_ttl(),
            takes_token,
            // A spec outlives the longest park and the next attempt's
            // round trip, as a waiting writer's place does.
            grantable: grantable.map(|(_, lease)| (lease, self.raw.place())),
        };
        let sent = Instant::now();
        let reply = self.raw.read(&self.keys, args);
        if let (
            Some((grantable, lease)),
            Ok(RwAcquireReply::Held {
                spec_left: true, ..
            }),
        ) = (grantable, &reply)
        {
            // The spec this attempt left names this request: a grant for
            // it comes after it was sent.
            let mark = Mark {
                sent,
                lease,
                request,
            };
            grantable.mark(backend::ticket(identity, request), mark);
        }
        self.settle(Kind::Read, identity, mode, request, sent, reply)
            .map(|attempt| attempt.map(ReadGuard::new))
    }

    /// One run of the write script; `queue` when the caller will wait if
    /// refused (it keeps, or renews, its place among the waiting writers);
    /// `takes_token`: it pops the write baton first (see
    /// `ParkHow::claims`; the upgradable reader's upgrade, which waits on
    /// another list, takes none).
    fn attempt_write(
        &self,
        identity: &Arc<str>,
        queue: bool,
        takes_token: bool,
    ) -> Result<Attempt<WriteGuard>, Error> {
        self.attempt_write_granted(identity, queue, takes_token, None)
    }

    /// [`attempt_write`](RwLock::attempt_write) by a waiter that may be
    /// granted the write hold while parked (`grantable`, with the grant's
    /// lease): a refusal that keeps its place leaves its spec, and its park
    /// after this attempt carries the attempt's ticket.
    fn attempt_write_granted(
        &self,
        identity: &Arc<str>,
        queue: bool,
        takes_token: bool,
        grantable: Option<(&Grantable, Duration)>,
    ) -> Result<Attempt<WriteGuard>, Error> {
        self.refuse_upgrade(identity)?;
        let held = self.held(Kind::Write, identity);
        if held.is_none() && self.holds(Kind::Upgradable, identity) {
            // The upgradable reader's write is an upgrade.
            return self.attempt_upgrade(identity, queue);
        }
        let (held_fence, guards, mode) = held.unwrap_or((0, 0, self.mode()));
        let read_token = self.held(Kind::Read, identity).map_or(0, |held| held.0);
        let request = self.context.next_request();
        let args = WriteArgs {
            identity,
            lease: mode.lease(),
            held_fence,
            depth: guards + 1,
            fence_ttl: self.raw.fence_ttl(),
            request,
            place: queue.then(|| self.raw.place()),
            read_token,
            takes_token,
            // A spec lives as long as the place it is kept with.
            grantable: grantable
                .filter(|_| queue)
                .map(|(_, lease)| (lease, self.raw.place())),
        };
        let sent = Instant::now();
        let reply = self.raw.write(&self.keys, args);
        if let (
            Some((grantable, lease)),
            Ok(RwAcquireReply::Held {
                spec_left: true, ..
            }),
        ) = (grantable, &reply)
        {
            let mark = Mark {
                sent,
                lease,
                request,
            };
            grantable.mark(backend::ticket(identity, request), mark);
        }
        self.settle(Kind::Write, identity, mode, request, sent, reply)
            .map(|attempt| attempt.map(WriteGuard::new))
    }

    /// What an acquisition of `kind` sent at `sent` as request `request`
    /// came to: a hold recorded in the registry (and renewed by the
    /// watchdog), a refusal, or an error (a request whose reply was lost
    /// is undone in the background).
    fn settle(
        &self,
        kind: Kind,
        identity: &Arc<str>,
        mode: LeaseMode,
        request: u64,
        sent: Instant,
        reply: Result<RwAcquireReply, crate::backend::Failed>,
    ) -> Result<Attempt<Hold>, Error> {
        match reply {
            Ok(RwAcquireReply::Acquired { token, .. }) => Ok(Attempt::Acquired(
                self.hold(kind, identity, token, mode, sent),
            )),
            Ok(RwAcquireReply::Held { lease_left, .. }) => Ok(Attempt::Held {
                lease_left,
                handing_over: false,
                park_on: None,
                passed_on: false,
            }),
            Ok(RwAcquireReply::UpgradeRefused) => Err(self.upgrade_refused()),
            Ok(RwAcquireReply::NotHeld) => Err(Error::LockLost {
                name: self.keys.name.clone(),
            }),
            Err(failed) => {
                if failed.outcome_unknown {
                    let undo = raw::undo_later(
                        &self.raw,
                        &self.keys,
                        identity,
                        request,
                        mode.lease(),
                        sent,
                    );
                    self.context.finish_later(undo);
                }
                Err(failed.error)
            }
        }
    }
}

impl RwLock {
    /// The hold of `kind` taken under `token` by an acquisition (or, for a
    /// granted read, the attempt it followed) sent at `sent`.
    fn hold(
        &self,
        kind: Kind,
        identity: &Arc<str>,
        token: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> Hold {
        let leased = match kind {
            Kind::Read => &self.read_leased,
            Kind::Upgradable => &self.upgradable_leased,
            Kind::Write => &self.write_leased,
        };
        let (status, mode) = self.context.enter(leased, identity, token, mode, sent);
        Hold {
            context: Arc::clone(&self.context),
            raw: Arc::clone(&self.raw),
            keys: Arc::clone(&self.keys),
            kind,
            identity: Arc::clone(identity),
            token,
            mode,
            status,
            released: false,
            acquired: self.context.observer().is_set().then(Instant::now),
        }
    }

    /// The hold of `kind` (a read, the write hold) a release granted this
    /// waiter while it was parked, if one did (see `release_write.lua`,
    /// `lib/write_grant.lua`).
    ///
    /// The grant's lease is counted from the sending of the attempt the
    /// waiter's park followed, as a granted lock's or permit's is (see
    /// `sync::grants`): its first renewal is due at once. A grant that came
    /// long after that attempt is confirmed by one renewal first (`None`
    /// if it found the hold gone, or failed, then undone in the
    /// background: the waiter asks again).
    fn take_grant(&self, kind: Kind, identity: &Arc<str>, grantable: &Grantable) -> Option<Hold> {
        let (taken, fresh) = match grantable.take()? {
            Ok(taken) => (taken, true),
            Err(late) => (late, false),
        };
        let token = taken.receipt.token;
        let mode = self.mode();
        // One deployment, whose single clock is the lease's: no margin.
        let counted = taken.counted_from(mode, Duration::ZERO);
        let sent = match counted.filter(|_| fresh) {
            Some(sent) => sent,
            None => {
                let sent = Instant::now();
                let lease = mode.lease();
                let renewed = self.raw.renew(&self.keys, kind, identity, token, lease);
                match renewed {
                    Ok(true) => sent,
                    Ok(false) => return None,
                    Err(err) => {
                        log::debug!(
                            "redbaton: confirming a late grant of {:?} failed: {err}",
                            self.name()
                        );
                        // The renewal may have run, lengthening a hold
                        // nobody will release: a read is undone (by its
                        // request, the grant's token), a write hold
                        // released, once Redis answers.
                        let (raw, keys) = (&self.raw, &self.keys);
                        let cleanup = match kind {
                            Kind::Read => raw::undo_later(raw, keys, identity, token, lease, sent),
                            Kind::Write | Kind::Upgradable => {
                                raw::release_later(raw, keys, kind, identity, token, lease, sent)
                            }
                        };
                        self.context.finish_later(cleanup);
                        return None;
                    }
                }
            }
        };
        Some(self.hold(kind, identity, token, mode, sent))
    }

    /// Takes this waiting reader's grant spec off, if an attempt may have
    /// left one: it stops waiting unserved. Best effort: a spec left
    /// behind ends with its TTL, and a grant by it is given back.
    fn withdraw_read_spec(&self, identity: &str, grantable: Option<&Grantable>) {
        if !grantable.is_some_and(Grantable::is_marked) {
            return;
        }
        if let Err(err) = self.raw.withdraw_read_spec(&self.keys, identity) {
            log::debug!(
                "redbaton: taking a read grant spec of {:?} off failed: {err}",
                self.name()
            );
        }
    }
}

/// Gives back `unclaimed`, a read of the read-write lock `keys` a writer's
/// release granted a waiter of this client, or the write hold a release
/// granted one, that no parked waiter took: the hold's last release, which
/// grants or wakes who waits next. A read is released only while its lease
/// still ends where the grant's did, a write hold only under the grant's
/// fence: a waiter that took either since (`read.lua`, `write.lua`) keeps
/// it.
pub(super) fn give_back(
    conn: &mut dyn redis::ConnectionLike,
    settings: &GiveBackSettings,
    keys: &RwKeys,
    unclaimed: Unclaimed<'_>,
) -> redis::RedisResult<()> {
    let grants = Some(WriteGrants {
        channels: &settings.channels,
        fence_ttl: settings.fence_ttl,
    });
    let (owner, token, lease, baton_ttl) = (
        unclaimed.owner,
        unclaimed.token,
        settings.lease,
        settings.baton_ttl,
    );
    let call = if unclaimed.behind == calls::WRITE_GRANT_BEHIND {
        calls::release_write(keys, owner, token, 0, lease, baton_ttl, grants)
    } else {
        let ends = unclaimed.behind;
        calls::give_back_read(keys, owner, token, ends, lease, baton_ttl, grants)
    };
    call.invoke::<redis::Value>(conn).map(drop)
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.keys.name)
            .field("fixed_lease", &self.fixed_lease)
            .finish_non_exhaustive()
    }
}

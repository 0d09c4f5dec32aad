//! The upgradable read: [`RwLock::upgradable_read`] and its relatives,
//! [`UpgradableReadGuard`], and the upgrade (the upgradable reader's way
//! to the write hold).
//!
//! One thread at a time holds the upgradable read, beside any number of
//! plain readers; writers stay out while it lives. Its upgrade takes the
//! write hold *beside* it once the other readers have left: the
//! upgradable hold never lapses in between, so no writer (and no other
//! upgradable reader) can get in first, whoever waited longer. While the
//! upgrade waits, a mark on the upgradable hold keeps fresh readers out
//! (as a waiting writer's place does), so a stream of readers cannot
//! starve it. When the write guard goes, the thread holds the upgradable
//! read again: that is the way back from write to upgradable.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::guard::{hold_accessors, Hold};
use super::raw::Kind;
use super::{ReadGuard, RwLock, WriteGuard};
use crate::error::Error;
use crate::observe::{Acquisition, HoldKind, LostReason};
use crate::parking::{self, Attempt, Waited};
use crate::scripts::rwlock::{UpgradableArgs, UpgradeArgs};

impl RwLock {
    /// Blocks until the calling thread holds the upgradable read: shared
    /// with plain readers, but with no writer and no other upgradable
    /// reader. Its guard can [`upgrade`](UpgradableReadGuard::upgrade) to
    /// the write hold without letting a writer in between.
    ///
    /// While a writer or another upgradable reader holds the lock, or a
    /// writer waits for it, the thread waits without spinning: in a
    /// `BLPOP` on the lock's upgradable baton until the holder releases
    /// (or its lease ends); one thread per process parks in Redis, the
    /// others wait locally. Uncontended, this is one script call.
    ///
    /// Re-entrant: the holder may take it again (one more level). A thread
    /// that writes may take it at once (it is alone); when its write
    /// guards go, it holds the upgradable read.
    ///
    /// # Errors
    /// [`Error::UpgradeRefused`] when the calling thread holds the lock
    /// for reading only (found locally, before any network call: an
    /// upgrade under way would wait for that read hold, and the thread
    /// for the upgrade); otherwise as [`read`](RwLock::read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let stock = client.rw_lock("stock:42")?;
    ///
    /// let checking = stock.upgradable_read()?; // readers may come and go
    /// let low = true; // ... read the stock level ...
    /// if low {
    ///     // Waits for the readers to leave; no writer gets in between.
    ///     let writing = checking.upgrade()?;
    ///     let token = writing.fencing_token();
    ///     // ... reorder, passing `token` to the storage ...
    ///     # let _ = token;
    ///     drop(writing); // back to the upgradable read
    /// }
    /// let reading = checking.downgrade()?; // a plain read hold now
    /// # drop(reading);
    /// # Ok(())
    /// # }
    /// ```
    pub fn upgradable_read(&self) -> Result<UpgradableReadGuard, Error> {
        loop {
            if let Some(guard) = self.acquire_upgradable(None)? {
                return Ok(guard);
            }
        }
    }

    /// One attempt at the upgradable read: the guard if no writer or other
    /// upgradable reader holds it and no writer waits (or the thread
    /// already holds it, or writes), `None` otherwise. Never waits. One
    /// script call.
    ///
    /// # Errors
    /// As [`upgradable_read`](RwLock::upgradable_read).
    pub fn try_upgradable_read(&self) -> Result<Option<UpgradableReadGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let failed = |err| self.failed(start, HoldKind::Upgradable, err);
        let identity = self.context.identity().map_err(failed)?;
        self.refuse_upgrade(&identity).map_err(failed)?;
        match self.attempt_upgradable(&identity, false).map_err(failed)? {
            Attempt::Acquired(guard) => Ok(Some(guard.announced(start, Acquisition::FirstAttempt))),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Like [`upgradable_read`](RwLock::upgradable_read), but gives up
    /// after `timeout` and returns `None`. A timeout too large to be a
    /// point in time means no deadline.
    ///
    /// # Errors
    /// As [`upgradable_read`](RwLock::upgradable_read).
    pub fn try_upgradable_read_for(
        &self,
        timeout: Duration,
    ) -> Result<Option<UpgradableReadGuard>, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_upgradable_read_until(deadline),
            None => self.upgradable_read().map(Some),
        }
    }

    /// Like [`upgradable_read`](RwLock::upgradable_read), but gives up at
    /// `deadline` and returns `None`.
    ///
    /// # Errors
    /// As [`upgradable_read`](RwLock::upgradable_read).
    pub fn try_upgradable_read_until(
        &self,
        deadline: Instant,
    ) -> Result<Option<UpgradableReadGuard>, Error> {
        self.acquire_upgradable(Some(deadline))
    }

    /// The first attempt at the upgradable read, then the wait loop until
    /// `deadline`.
    fn acquire_upgradable(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<UpgradableReadGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let context = &self.context;
        let failed = |err| self.failed(start, HoldKind::Upgradable, err);
        let identity =
            parking::ride_out(deadline, context.config.io_timeout, || context.identity())
                .map_err(failed)?;
        self.refuse_upgrade(&identity).map_err(failed)?;
        // A newcomer queues behind this process's waiting threads; the
        // holder re-entering never queues, nor does the writer.
        let holds = self.holds(Kind::Upgradable, &identity) || self.holds(Kind::Write, &identity);
        if holds || !context.room.has_waiters(&self.keys.upgradable_baton) {
            match self.attempt_upgradable(&identity, false) {
                Ok(Attempt::Acquired(guard)) => {
                    return Ok(Some(guard.announced(start, Acquisition::FirstAttempt)))
                }
                Ok(Attempt::Held { .. }) => {}
                Err(err) if err.is_transient() => {
                    log::debug!(
                        "redbaton: first upgradable read attempt on {:?} failed: {err}",
                        self.name()
                    );
                }
                Err(err) => return Err(failed(err)),
            }
        }
        loop {
            let waited = context.room.wait_until(
                &self.keys.name,
                &self.keys.upgradable_baton,
                None,
                (),
                deadline,
                // Attempts take no token: a look pops it for them.
                None,
                None,
                None,
                || self.attempt_upgradable(&identity, true),
            )?;
            match waited {
                Waited::Acquired(guard) => {
                    return Ok(Some(guard.announced(start, Acquisition::AfterWaiting)))
                }
                Waited::TimedOut => return Ok(None),
                // Nothing is handed over locally in this room.
                Waited::Granted(()) => {}
            }
        }
    }

    /// One run of the upgradable script; `waited` when the caller comes
    /// from the wait loop.
    fn attempt_upgradable(
        &self,
        identity: &Arc<str>,
        waited: bool,
    ) -> Result<Attempt<UpgradableReadGuard>, Error> {
        let held = self.held(Kind::Upgradable, identity);
        let (held_token, guards, mode) = held.unwrap_or((0, 0, self.mode()));
        let request = self.context.next_request();
        let args = UpgradableArgs {
            identity,
            lease: mode.lease(),
            held_token,
            depth: guards + 1,
            request,
            waited,
        };
        let sent = Instant::now();
        let reply = self.raw.upgradable(&self.keys, args);
        self.settle(Kind::Upgradable, identity, mode, request, sent, reply)
            .map(|attempt| attempt.map(|hold| UpgradableReadGuard::new(hold, self.clone())))
    }

    /// The upgrade of `identity`'s upgradable hold, waiting until
    /// `deadline`: the first attempt, then parks on the upgrade baton
    /// (pushed by the last other reader's release). An upgrade that gives
    /// up takes its mark off, so readers it held back go on. `start`: when
    /// the call started, if a hook was set then.
    pub(super) fn upgrade_then_wait(
        &self,
        identity: &Arc<str>,
        deadline: Option<Instant>,
        start: Option<Instant>,
    ) -> Result<Option<(WriteGuard, Acquisition)>, Error> {
        let context = &self.context;
        // An upgrade that will wait marks it with this attempt.
        let mut marked = deadline.is_none_or(|deadline| deadline > Instant::now());
        match self.attempt_upgrade(identity, marked) {
            Ok(Attempt::Acquired(guard)) => return Ok(Some((guard, Acquisition::FirstAttempt))),
            Ok(Attempt::Held { .. }) => {}
            Err(err) if err.is_transient() => {
                log::debug!(
                    "redbaton: first upgrade attempt on {:?} failed: {err}",
                    self.name()
                );
            }
            Err(err) => return Err(self.failed(start, HoldKind::Write, err)),
        }
        let waited = loop {
            let waited = context.room.wait_until(
                &self.keys.name,
                &self.keys.upgrade_baton,
                None,
                (),
                deadline,
                // Attempts take no token: a look pops it for them.
                None,
                None,
                None,
                || {
                    marked = true;
                    self.attempt_upgrade(identity, true)
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
                let token = self.held(Kind::Upgradable, identity).map(|held| held.0);
                if let (true, Some(token)) = (marked, token) {
                    // Best effort: a mark left behind ends by itself
                    // within one park time.
                    if let Err(err) = self.raw.cancel_upgrade(&self.keys, identity, token) {
                        log::debug!(
                            "redbaton: taking the upgrade mark of {:?} off failed: {err}",
                            self.name()
                        );
                    }
                }
                other.map(|_| None)
            }
        }
    }

    /// One run of the upgrade script for `identity`, which holds the
    /// upgradable read; `mark` when the caller will wait if refused (it
    /// keeps, or renews, its mark). The write hold it makes has the
    /// upgradable hold's lease mode.
    pub(super) fn attempt_upgrade(
        &self,
        identity: &Arc<str>,
        mark: bool,
    ) -> Result<Attempt<WriteGuard>, Error> {
        let Some((upgradable_token, _, mode)) = self.held(Kind::Upgradable, identity) else {
            return Err(self.upgradable_lost());
        };
        let read_token = self.held(Kind::Read, identity).map_or(0, |held| held.0);
        let request = self.context.next_request();
        let args = UpgradeArgs {
            identity,
            upgradable_token,
            lease: mode.lease(),
            fence_ttl: self.raw.fence_ttl(),
            request,
            mark: mark.then(|| self.raw.place()),
            read_token,
        };
        let sent = Instant::now();
        let reply = self.raw.upgrade(&self.keys, args);
        self.settle(Kind::Write, identity, mode, request, sent, reply)
            .map(|attempt| attempt.map(WriteGuard::new))
    }

    fn upgradable_lost(&self) -> Error {
        Error::LockLost {
            name: self.keys.name.clone(),
        }
    }

    /// Whether `hold` is still the calling thread's upgradable hold (not
    /// found lost, nor released and taken afresh).
    fn check_upgradable(&self, hold: &Hold) -> Result<(), Error> {
        let current = self.held(Kind::Upgradable, &hold.identity);
        if hold.status.is_marked_lost() || current.map(|held| held.0) != Some(hold.token) {
            return Err(self.upgradable_lost());
        }
        Ok(())
    }
}

/// Held while the calling thread holds the upgradable read of a
/// [`RwLock`]: plain readers may hold it too, no writer and no other
/// upgradable reader can. Made by
/// [`RwLock::upgradable_read`] and its `try_` relatives.
///
/// [`upgrade`](UpgradableReadGuard::upgrade) takes the write hold beside
/// it, once the other readers have left; no writer gets in between. The
/// write guard it returns is a plain [`WriteGuard`] with a fresh fencing
/// token; when it goes (dropped or unlocked), the thread holds the
/// upgradable read again, and readers may come back in.
/// [`downgrade`](UpgradableReadGuard::downgrade) turns it into a plain
/// read hold.
///
/// The thread's upgradable hold ends when its last upgradable guard is gone
/// (re-entered holds count levels). Releasing is one script call, bounded
/// like [`LockGuard`](crate::LockGuard)'s. Dropping logs a failed release
/// with `log::warn!`; call [`unlock`](UpgradableReadGuard::unlock) to get
/// the error. Its lease is renewed by the watchdog (or fixed, as the
/// handle's), like a read hold's.
///
/// A guard is `!Send`: the hold belongs to the thread that took it.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redbaton::UpgradableReadGuard>();
/// ```
#[must_use = "the upgradable read is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct UpgradableReadGuard {
    hold: Hold,
    /// The handle it was taken through: the upgrade goes through it.
    lock: RwLock,
    /// `MutexGuard` is `!Send` (and `Sync`): the identity is the thread's.
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

hold_accessors!(UpgradableReadGuard);

impl UpgradableReadGuard {
    fn new(hold: Hold, lock: RwLock) -> Self {
        UpgradableReadGuard {
            hold,
            lock,
            _not_send: PhantomData,
        }
    }

    /// Blocks until the calling thread holds the write lock as well: it
    /// waits for the plain readers to leave (its own read guards, if any,
    /// are not in the way), holding fresh readers back meanwhile; no
    /// writer gets in first, however long it has waited. The returned
    /// guard's [`fencing_token`](WriteGuard::fencing_token) is fresh, like
    /// any write hold's. When it goes, this guard holds the upgradable read
    /// again.
    ///
    /// While readers hold the lock, the thread parks in a `BLPOP` on the
    /// lock's upgrade baton, pushed by the last reader's release (or until
    /// the last reader's lease ends). Uncontended, one script call. If the
    /// thread already writes, this re-enters its write hold.
    ///
    /// # Errors
    /// [`Error::LockLost`] when this upgradable hold is no longer the
    /// thread's (its lease ran out): nothing was changed. Redis failures
    /// as for [`RwLock::write`].
    pub fn upgrade(&self) -> Result<WriteGuard, Error> {
        self.lock.check_upgradable(&self.hold)?;
        self.lock.write()
    }

    /// One attempt to upgrade: the write guard if no other reader holds
    /// the lock, `None` otherwise. Never waits and leaves no mark. One
    /// script call.
    ///
    /// # Errors
    /// As [`upgrade`](UpgradableReadGuard::upgrade).
    pub fn try_upgrade(&self) -> Result<Option<WriteGuard>, Error> {
        self.lock.check_upgradable(&self.hold)?;
        self.lock.try_write()
    }

    /// Like [`upgrade`](UpgradableReadGuard::upgrade), but gives up after
    /// `timeout` and returns `None` (the thread keeps its upgradable read).
    /// A timeout too large to be a point in time means no deadline.
    ///
    /// # Errors
    /// As [`upgrade`](UpgradableReadGuard::upgrade).
    pub fn try_upgrade_for(&self, timeout: Duration) -> Result<Option<WriteGuard>, Error> {
        self.lock.check_upgradable(&self.hold)?;
        self.lock.try_write_for(timeout)
    }

    /// Like [`upgrade`](UpgradableReadGuard::upgrade), but gives up at
    /// `deadline` and returns `None` (the thread keeps its upgradable
    /// read). An upgrade that gives up takes its mark off at once (one more
    /// script call), so readers it held back go on.
    ///
    /// # Errors
    /// As [`upgrade`](UpgradableReadGuard::upgrade).
    pub fn try_upgrade_until(&self, deadline: Instant) -> Result<Option<WriteGuard>, Error> {
        self.lock.check_upgradable(&self.hold)?;
        self.lock.try_write_until(deadline)
    }

    /// Turns this upgradable read into a plain read: takes a read hold
    /// (never kept waiting: no writer can hold the lock meanwhile, and the
    /// upgradable reader passes waiting writers), then releases this
    /// guard. At every moment the thread holds one or the other, so no
    /// writer gets in between. Two script calls; another thread may take
    /// the upgradable read after it.
    ///
    /// # Errors
    /// [`Error::LockLost`] when this upgradable hold was no longer the
    /// thread's; Redis failures as for [`RwLock::read`]. On an error the
    /// thread holds neither (the read hold, when taken, is released).
    pub fn downgrade(self) -> Result<ReadGuard, Error> {
        self.lock.check_upgradable(&self.hold)?;
        let Some(read) = self.lock.try_read()? else {
            // Refused: a writer holds the lock, so this hold is gone.
            return Err(self.lock.upgradable_lost());
        };
        self.unlock()?;
        Ok(read)
    }
}

impl fmt::Debug for UpgradableReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The identity is left out: it is what lets a thread release.
        f.debug_struct("UpgradableReadGuard")
            .field("name", &self.hold.keys.name)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

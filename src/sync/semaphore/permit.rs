//! [`SemaphorePermit`]: permits held under one leased permit id, returned
//! when dropped.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::raw::{self, RawSemaphore};
use crate::backend::Sent;
use crate::context::Context;
use crate::error::Error;
use crate::keys::SemaphoreKeys;
use crate::lease::{LeaseMode, LeaseStatus};
use crate::observe::{Acquisition, Event, HoldKind, LostReason};
use crate::scripts::semaphore::ReleaseReply;

/// What one acquisition holds.
#[derive(Debug)]
pub(super) struct Held {
    /// The permit id: `<thread identity>:<request number>`.
    pub(super) id: Arc<str>,
    pub(super) permits: u64,
    /// The lease mode the permits were taken with.
    pub(super) mode: LeaseMode,
    /// Shared with the watchdog.
    pub(super) status: Arc<LeaseStatus>,
}

/// Permits of a [`Semaphore`](crate::Semaphore), held until this guard is
/// dropped or [`release`](SemaphorePermit::release)d.
///
/// The permits live in Redis under an id of their own with a lease: while
/// the guard lives the client's watchdog renews it (or, from a handle made
/// by [`Semaphore::with_fixed_lease`](crate::Semaphore::with_fixed_lease),
/// it ends on time). If this process dies, the permits return to the
/// semaphore when their lease ends. Two guards of one thread are two
/// holdings: each returns its own permits.
///
/// Releasing is one script call, bounded by twice the client's I/O timeout
/// (a pooled connection, then the reply). Dropping the guard logs a failed
/// release with `log::warn!`; call [`release`](SemaphorePermit::release) to
/// get the error instead. A release that could not reach Redis is sent
/// again by the client's background thread until Redis answers, so the
/// permits return as soon as it does rather than when their lease ends.
///
/// Unlike a [`LockGuard`](crate::LockGuard), a permit is `Send`: it belongs
/// to no thread, and may be released from another.
#[must_use = "the permits are released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct SemaphorePermit {
    context: Arc<Context>,
    raw: Arc<dyn RawSemaphore>,
    keys: Arc<SemaphoreKeys>,
    held: Held,
    released: bool,
    /// When the permit was made; measured only for the event hook.
    acquired: Option<Instant>,
}

impl SemaphorePermit {
    pub(super) fn new(
        context: Arc<Context>,
        raw: Arc<dyn RawSemaphore>,
        keys: Arc<SemaphoreKeys>,
        held: Held,
    ) -> Self {
        let acquired = context.observer().is_set().then(Instant::now);
        SemaphorePermit {
            context,
            raw,
            keys,
            held,
            released: false,
            acquired,
        }
    }

    /// Tells the event hook of this permit, got `how` after a call that
    /// started at `start` (`None`: no hook was set then).
    pub(super) fn announced(self, start: Option<Instant>, how: Acquisition) -> Self {
        if let Some(start) = start {
            self.context.observer().emit(|| Event::Acquired {
                name: &self.keys.name,
                kind: HoldKind::Permits,
                waited: start.elapsed(),
                fencing_token: None,
                how,
            });
        }
        self
    }

    /// How many permits this guard holds.
    pub fn num_permits(&self) -> u64 {
        self.held.permits
    }

    /// The name of the semaphore.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Whether the permits can no longer be counted on: the watchdog found
    /// their lease ended, a release found them gone, or their validity
    /// ([`valid_until`](SemaphorePermit::valid_until)) passed without a
    /// confirmed renewal. No network call. `false` is not a promise: the
    /// lease may end the next moment.
    pub fn is_lost(&self) -> bool {
        self.held.status.is_lost()
    }

    /// A receiver that gets the [`LostReason`] once, when these permits
    /// are found lost, to block or `select!` on; disconnected without a
    /// message when the permit is released. As
    /// [`LockGuard::lost`](crate::LockGuard::lost), whose documentation
    /// says when it fires.
    pub fn lost(&self) -> Receiver<LostReason> {
        let held = &self.held;
        self.context
            .lost_signal(&held.status, held.mode, &self.keys.name, HoldKind::Permits)
    }

    /// When the permits' lease ends at the latest unless renewed, by this
    /// process's clock: the lease counted from before the request that set
    /// it was sent, so never later than its end in Redis. Renewals move it
    /// out. No network call.
    pub fn valid_until(&self) -> Instant {
        self.held.status.valid_until()
    }

    /// Returns the permits to the semaphore and reports the outcome. Wakes
    /// as many waiters as the permits may serve (one token each in the
    /// semaphore's baton list).
    ///
    /// # Errors
    /// [`Error::PermitsLost`] when the permits' lease had ended: they had
    /// already returned to the semaphore (counted once, never twice), and
    /// others may have held them meanwhile. Redis failures otherwise (the
    /// release then goes on in the background).
    pub fn release(mut self) -> Result<(), Error> {
        self.give_back()
    }

    fn give_back(&mut self) -> Result<(), Error> {
        let released = self.give_back_once();
        if let Some(acquired) = self.acquired {
            self.context.observer().release_outcome(
                &self.keys.name,
                HoldKind::Permits,
                acquired,
                &released,
                self.held.status.was_told_lost(),
            );
        }
        released
    }

    fn give_back_once(&mut self) -> Result<(), Error> {
        self.released = true;
        let held = &self.held;
        // Withdraw from the watchdog first, so that it stops renewing (a
        // renewal already in flight finds the permits gone, and changes
        // nothing).
        let left =
            self.context
                .leases
                .registry
                .leave(&self.keys.holders, &held.id, &held.status, false);
        // The holding ends here: its loss signal is disconnected, untold.
        held.status.close_signal();
        // Out of time by this clock is not enough to skip the release: the
        // lease may still run in Redis, and the script checks the id.
        if left.is_none() || held.status.is_marked_lost() {
            return Err(self.lost_error());
        }
        let sent = Instant::now();
        match self.raw.release(&self.keys, &held.id) {
            Ok(Sent {
                value: ReleaseReply::Released { .. },
                ..
            }) => Ok(()),
            // Sent twice, and "not held" the second time: the first send,
            // cut off on its way back, released them.
            Ok(Sent {
                value: ReleaseReply::NotHeld,
                resent: true,
            }) => Ok(()),
            Ok(Sent {
                value: ReleaseReply::NotHeld,
                ..
            }) => Err(self.lost_error()),
            Ok(Sent {
                value: ReleaseReply::Refused(refusal),
                ..
            }) => Err(raw::refused(&self.keys, refusal, held.permits)),
            Err(failed) => {
                let error = failed.error;
                if error.is_transient() || error.is_timeout() {
                    let cleanup = raw::release_later(
                        &self.raw,
                        &self.keys,
                        &held.id,
                        held.mode.lease(),
                        sent,
                    );
                    self.context.finish_later(cleanup);
                }
                Err(error)
            }
        }
    }

    /// Marks the permits lost and makes the error for it.
    fn lost_error(&self) -> Error {
        let held = &self.held;
        if held.status.mark_lost(LostReason::NotHeld) {
            log::warn!(
                "redbaton: {} permit(s) of semaphore {:?} were lost",
                held.permits,
                self.keys.name
            );
            self.context.observer().emit(|| Event::Lost {
                name: &self.keys.name,
                kind: HoldKind::Permits,
                reason: LostReason::NotHeld,
            });
        }
        self.context
            .leases
            .registry
            .forget(&self.keys.holders, &held.id, &held.status);
        Error::PermitsLost {
            name: self.keys.name.clone(),
            permits: held.permits,
        }
    }
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(err) = self.give_back() {
            log::warn!(
                "redbaton: releasing permits of semaphore {:?} on drop failed: {err}",
                self.keys.name
            );
        }
    }
}

impl fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("name", &self.keys.name)
            .field("permits", &self.held.permits)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

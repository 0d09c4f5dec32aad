//! [`ReadGuard`] and [`WriteGuard`]: proof of holding a read-write lock for
//! reading or for writing, released when dropped. Both wrap one [`Hold`],
//! which knows how to release and report a hold of any kind (the
//! upgradable read's guard, in `upgradable.rs`, wraps one too).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::raw::{self, Kind, RawRwLock};
use crate::context::Context;
use crate::error::Error;
use crate::keys::RwKeys;
use crate::lease::{LeaseMode, LeaseStatus};
use crate::observe::{Acquisition, Event, HoldKind, LostReason};
use crate::scripts::reply::ReleaseReply;

/// One guard's share of a hold: a read, upgradable or write hold of one
/// thread, shared by its re-entered guards through `status`.
#[derive(Debug)]
pub(super) struct Hold {
    pub(super) context: Arc<Context>,
    pub(super) raw: Arc<RawRwLock>,
    pub(super) keys: Arc<RwKeys>,
    pub(super) kind: Kind,
    pub(super) identity: Arc<str>,
    /// The write hold's fencing token, or the read or upgradable hold's
    /// token.
    pub(super) token: u64,
    /// The hold's lease mode (that of its first acquisition).
    pub(super) mode: LeaseMode,
    /// Shared by the guards of this hold (re-entry) and the watchdog.
    pub(super) status: Arc<LeaseStatus>,
    pub(super) released: bool,
    /// When the hold was made; measured only for the event hook.
    pub(super) acquired: Option<Instant>,
}

impl Hold {
    /// What is held, for events.
    fn hold_kind(&self) -> HoldKind {
        match self.kind {
            Kind::Read => HoldKind::Read,
            Kind::Upgradable => HoldKind::Upgradable,
            Kind::Write => HoldKind::Write,
        }
    }

    /// A receiver of this hold's loss signal (see `LockGuard::lost`).
    pub(super) fn lost_signal(&self) -> Receiver<LostReason> {
        self.context
            .lost_signal(&self.status, self.mode, &self.keys.name, self.hold_kind())
    }

    /// The key the hold's lease lives on (and the registry files it under).
    fn lease_key(&self) -> &str {
        match self.kind {
            Kind::Read => &self.keys.readers,
            Kind::Upgradable => &self.keys.upgradable,
            Kind::Write => &self.keys.write,
        }
    }

    /// Tells the event hook of this hold, got `how` after a call that
    /// started at `start` (`None`: no hook was set then).
    pub(super) fn announce(&self, start: Option<Instant>, how: Acquisition) {
        if let Some(start) = start {
            self.context.observer().emit(|| Event::Acquired {
                name: &self.keys.name,
                kind: self.hold_kind(),
                waited: start.elapsed(),
                fencing_token: (self.kind == Kind::Write).then_some(self.token),
                how,
            });
        }
    }

    pub(super) fn release(&mut self) -> Result<(), Error> {
        let released = self.release_once();
        if let Some(acquired) = self.acquired {
            self.context.observer().release_outcome(
                &self.keys.name,
                self.hold_kind(),
                acquired,
                &released,
                self.status.was_told_lost(),
            );
        }
        released
    }

    fn release_once(&mut self) -> Result<(), Error> {
        self.released = true;
        let context = &self.context;
        // Withdraw from the watchdog first, so that it stops renewing.
        let left =
            context
                .leases
                .registry
                .leave(self.lease_key(), &self.identity, &self.status, false);
        if !matches!(left, Some(left) if left > 0) {
            // The hold ends here: its loss signal is disconnected, untold.
            self.status.close_signal();
        }
        let Some(left) = left.filter(|_| !self.status.is_marked_lost()) else {
            return Err(self.lost());
        };
        let lease = self.mode.lease();
        let sent = Instant::now();
        let released = self.raw.release(
            &self.keys,
            self.kind,
            &self.identity,
            self.token,
            left,
            lease,
        );
        match released {
            Ok(sent_reply) => match sent_reply.value {
                ReleaseReply::Inner { .. } => {
                    self.status.lives_from(sent, lease);
                    Ok(())
                }
                // (A read-write lock is not offered on a quorum.)
                ReleaseReply::Released | ReleaseReply::ReleasedInPart => Ok(()),
                // Sent twice: the first send, cut off on its way back, may
                // have released it.
                ReleaseReply::NotOwner if sent_reply.resent => Ok(()),
                ReleaseReply::NotOwner => Err(self.lost()),
            },
            Err(failed) => {
                let error = failed.error;
                if left == 0 && (error.is_transient() || error.is_timeout()) {
                    let cleanup = raw::release_later(
                        &self.raw,
                        &self.keys,
                        self.kind,
                        &self.identity,
                        self.token,
                        lease,
                        sent,
                    );
                    self.context.finish_later(cleanup);
                }
                Err(error)
            }
        }
    }

    /// Marks this hold lost and makes the error for it.
    fn lost(&self) -> Error {
        if self.status.mark_lost(LostReason::NotHeld) {
            log::warn!("redbaton: read-write lock {:?} was lost", self.keys.name);
            self.context.observer().emit(|| Event::Lost {
                name: &self.keys.name,
                kind: self.hold_kind(),
                reason: LostReason::NotHeld,
            });
        }
        self.context
            .leases
            .registry
            .forget(self.lease_key(), &self.identity, &self.status);
        Error::LockLost {
            name: self.keys.name.clone(),
        }
    }

    pub(super) fn drop_release(&mut self) {
        if self.released {
            return;
        }
        if let Err(err) = self.release() {
            log::warn!(
                "redbaton: releasing read-write lock {:?} on drop failed: {err}",
                self.keys.name
            );
        }
    }
}

/// Held while the calling thread reads under a [`RwLock`](crate::RwLock);
/// releases one level of its read hold when dropped or
/// [`unlock`](ReadGuard::unlock)ed.
///
/// The thread's read hold ends when its last read guard is gone
/// (re-entered holds count levels); the lock is free for a writer once
/// every reader's hold has ended. Releasing is one script call, bounded
/// like [`LockGuard`](crate::LockGuard)'s. Dropping logs a failed release
/// with `log::warn!`; call [`unlock`](ReadGuard::unlock) to get the error.
///
/// A guard is `!Send`: the hold belongs to the thread that took it.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redbaton::ReadGuard>();
/// ```
#[must_use = "the read lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct ReadGuard {
    hold: Hold,
    /// `MutexGuard` is `!Send` (and `Sync`): the identity is the thread's.
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

/// Held while the calling thread writes under a [`RwLock`](crate::RwLock):
/// nobody else reads or writes meanwhile. Releases one level of the write
/// hold when dropped or [`unlock`](WriteGuard::unlock)ed.
///
/// The write hold ends when the thread's last write guard is gone. A
/// thread that also took read guards meanwhile (a downgrade) keeps reading
/// after that: the lock stays read-held until those go too. Releasing is
/// one script call. Dropping logs a failed release with `log::warn!`; call
/// [`unlock`](WriteGuard::unlock) to get the error.
///
/// A guard is `!Send`: the hold belongs to the thread that took it.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redbaton::WriteGuard>();
/// ```
#[must_use = "the write lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct WriteGuard {
    hold: Hold,
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

/// What every guard says about its hold, without a network call, and its
/// release (by `unlock` or drop). The guard has a `hold: Hold` field.
macro_rules! hold_accessors {
    ($guard:ident) => {
        impl $guard {
            /// The name of the read-write lock this guard holds.
            pub fn name(&self) -> &str {
                &self.hold.keys.name
            }

            /// Whether the hold can no longer be counted on: the watchdog
            /// found it gone, a release was refused, or its validity
            /// ([`valid_until`](Self::valid_until)) passed without a
            /// confirmed renewal (a fixed lease ran out; a renewed one
            /// could not be renewed in time). No network call. `false` is
            /// not a promise: the lease may end the next moment.
            pub fn is_lost(&self) -> bool {
                self.hold.status.is_lost()
            }

            /// A receiver that gets the [`LostReason`] once, when this
            /// hold is found lost, to block or `select!` on; disconnected
            /// without a message when the hold's last guard releases. As
            /// [`LockGuard::lost`](crate::LockGuard::lost), whose
            /// documentation says when it fires.
            pub fn lost(&self) -> Receiver<LostReason> {
                self.hold.lost_signal()
            }

            /// Tells the event hook of this guard (see `Hold::announce`).
            pub(super) fn announced(self, start: Option<Instant>, how: Acquisition) -> Self {
                self.hold.announce(start, how);
                self
            }

            /// When this hold ends at the latest unless its lease is
            /// renewed, by this process's clock (the lease counted from
            /// before the request that set it was sent). Renewals and
            /// re-entry move it out. No network call.
            pub fn valid_until(&self) -> Instant {
                self.hold.status.valid_until()
            }

            /// Releases this level of the hold and reports the outcome.
            /// When the last release fails on the way to Redis, the
            /// client's background thread sends it again until Redis
            /// answers.
            ///
            /// # Errors
            /// [`Error::LockLost`] when the hold was no longer this
            /// thread's (its lease ran out): nothing was changed. Redis
            /// failures otherwise.
            pub fn unlock(mut self) -> Result<(), Error> {
                self.hold.release()
            }
        }

        impl Drop for $guard {
            fn drop(&mut self) {
                self.hold.drop_release();
            }
        }
    };
}

pub(super) use hold_accessors;

hold_accessors!(ReadGuard);
hold_accessors!(WriteGuard);

impl ReadGuard {
    pub(super) fn new(hold: Hold) -> Self {
        ReadGuard {
            hold,
            _not_send: PhantomData,
        }
    }
}

impl WriteGuard {
    pub(super) fn new(hold: Hold) -> Self {
        WriteGuard {
            hold,
            _not_send: PhantomData,
        }
    }

    /// The fencing token of this write hold: it grows with every fresh
    /// write acquisition of this lock name and stays the same on re-entry.
    /// Pass it to storage that rejects writes carrying a token lower than
    /// one it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token
    }
}

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The identity is left out: it is what lets a thread release.
        f.debug_struct("ReadGuard")
            .field("name", &self.hold.keys.name)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("name", &self.hold.keys.name)
            .field("fencing_token", &self.hold.token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

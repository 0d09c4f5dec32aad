//! [`LockGuard`]: proof of holding a lock, released when dropped.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::validate_lease;
use crate::client::Sent;
use crate::error::Error;
use crate::local_queue::{Grant, Reservation};
use crate::lock::Lock;
use crate::ownership::{LeaseMode, LeaseStatus};

/// Held while the calling thread owns a [`Lock`]; releases one level of it
/// when dropped or [`unlock`](LockGuard::unlock)ed.
///
/// The lock is free for others once the last guard of the holding thread is
/// gone (re-entered locks count levels). Releasing is one script call; it
/// takes at most twice the client's I/O timeout (a pooled connection, then
/// the reply), plus one watchdog round trip if a renewal is in flight.
/// Dropping a guard logs a failed release with `log::warn!`; call
/// [`unlock`](LockGuard::unlock) to get the error instead.
///
/// A guard is `!Send`: the lock belongs to the thread that took it.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redbaton::LockGuard>();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    lock: Lock,
    identity: Arc<str>,
    fence: u64,
    mode: LeaseMode,
    /// Shared by the guards of this ownership (re-entry) and the watchdog.
    status: Arc<LeaseStatus>,
    released: bool,
    /// Raw pointers are `!Send`; the identity is the thread's.
    _not_send: PhantomData<*const ()>,
}

impl LockGuard {
    pub(crate) fn new(
        lock: Lock,
        identity: Arc<str>,
        fence: u64,
        mode: LeaseMode,
        status: Arc<LeaseStatus>,
    ) -> Self {
        LockGuard {
            lock,
            identity,
            fence,
            mode,
            status,
            released: false,
            _not_send: PhantomData,
        }
    }

    /// The fencing token of this ownership: it grows with every fresh
    /// acquisition of this lock name and stays the same on re-entry. Pass it
    /// to a storage system that rejects writes carrying a token lower than
    /// one it has seen, so that a holder whose lease ran out cannot overwrite
    /// its successor's work.
    pub fn fencing_token(&self) -> u64 {
        self.fence
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// Whether the lock is known to be no longer this thread's: the watchdog
    /// found it gone or could not renew it before its lease ended, a fixed
    /// lease has run out, or an `extend` or release was refused. No network
    /// call. `false` is not a promise: the lease may end the next moment.
    pub fn is_lost(&self) -> bool {
        self.status.is_lost()
    }

    /// Makes the lock live at least `lease` from now: its end moves out,
    /// never in. Owner-checked in Redis: one script call.
    ///
    /// With a fixed lease this pushes its end out (a shorter `lease` than
    /// what is left changes nothing). With a renewed lease the watchdog
    /// keeps renewing as before, so only a `lease` longer than the client's
    /// lease changes anything: the lock then outlives a crash of this
    /// process by that much. Nothing but a release, or the lease running
    /// out, ends an ownership early; see [`Lock::with_fixed_lease`] for how
    /// re-entry through handles of other lease modes behaves.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms or over a year;
    /// [`Error::LockLost`] when the lock is no longer this thread's (the
    /// guard is then marked lost and nothing changes in Redis); Redis
    /// failures.
    pub fn extend(&self, lease: Duration) -> Result<(), Error> {
        validate_lease(lease)?;
        let sent = Instant::now();
        if self.lock.renew(&self.identity, self.fence, lease)? {
            self.status.fixed_lease_from(sent, lease);
            Ok(())
        } else {
            Err(self.lost())
        }
    }

    /// The lock's remaining lease, read from Redis (`PTTL`). One script call.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lock is no longer this thread's; Redis
    /// failures.
    pub fn remaining_lease(&self) -> Result<Duration, Error> {
        match self.lock.holder()? {
            Some(holder)
                if holder.owner == *self.identity && holder.fencing_token == self.fence =>
            {
                // Every acquisition sets a lease; none means someone ran
                // PERSIST on the key, and it will not end by itself.
                Ok(holder.remaining_lease.unwrap_or(Duration::MAX))
            }
            _ => Err(self.lost()),
        }
    }

    /// Releases this level of the lock and reports the outcome.
    ///
    /// A connection found dead (closed by the server's `timeout`, a proxy,
    /// `CLIENT KILL`) is replaced and the release sent again at once. When
    /// the last release still fails, the client's background thread sends
    /// it again until Redis answers, so the lock is freed as soon as Redis
    /// is back rather than when its lease ends.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lock was no longer this thread's (its
    /// lease ran out, or it was force-unlocked): nothing was changed, and a
    /// newer holder keeps the lock. Redis failures otherwise (the release
    /// goes on in the background, as above).
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        self.released = true;
        let shared = self.lock.shared();
        // Withdraw from the watchdog first, so that no renewal follows the
        // release (a renewal never re-creates a lock, but it must not touch
        // the next holder's either).
        let left = shared
            .ownerships
            .leave(self.lock.keys(), &self.identity, &self.status);
        let Some(left) = left.filter(|_| !self.status.is_lost()) else {
            return Err(self.lost());
        };
        if left == 0 {
            // The last guard: hand the lock to a waiter of this process if
            // there is one (and the run of local hand-offs is not too long).
            if let Some(reservation) = shared.queues.reserve(&self.lock.keys().lock) {
                return self.hand_off(reservation);
            }
            shared.queues.released_globally(&self.lock.keys().lock);
        }
        let sent = Instant::now();
        match self
            .lock
            .release(&self.identity, self.fence, left, self.mode.lease())
        {
            Err(Error::LockLost { .. }) => Err(self.lost()),
            Ok(_) => {
                if left > 0 {
                    // The inner release made the lock live at least the
                    // ownership's lease more.
                    self.status.fixed_lease_from(sent, self.mode.lease());
                }
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    /// Passes the lock to the reserved local waiter. On failure the waiter
    /// looks at the lock itself: if the hand-off happened unseen, its
    /// attempt finds the lock under its identity and takes it afresh; if
    /// not, the background thread frees this ownership once Redis answers.
    fn hand_off(&self, reservation: Reservation) -> Result<(), Error> {
        let shared = self.lock.shared();
        let request = shared.next_request();
        let sent = Instant::now();
        match self
            .lock
            .hand_off(&self.identity, self.fence, &reservation, request)
        {
            Ok(Sent {
                value: Some(fence), ..
            }) => {
                reservation.grant(Grant { fence, sent });
                Ok(())
            }
            // Sent twice, and the second found the lock no longer ours: the
            // first may have handed it over. The waiter looks for itself.
            Ok(Sent {
                value: None,
                resent: true,
            }) => {
                reservation.fail();
                Ok(())
            }
            Ok(Sent { value: None, .. }) => {
                reservation.fail();
                Err(self.lost())
            }
            Err(failed) => {
                self.lock.finish_failed_hand_off(
                    &self.identity,
                    self.fence,
                    self.mode.lease(),
                    &reservation,
                    request,
                    sent,
                );
                reservation.fail();
                Err(failed.error)
            }
        }
    }

    /// Marks this ownership lost and makes the error for it.
    fn lost(&self) -> Error {
        if self.status.mark_lost() {
            log::warn!("redbaton: lock {:?} was lost", self.lock.name());
        }
        self.lock
            .shared()
            .ownerships
            .forget(self.lock.keys(), &self.identity, &self.status);
        Error::LockLost {
            name: self.lock.name().to_owned(),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(err) = self.release() {
            log::warn!(
                "redbaton: releasing lock {:?} on drop failed: {err}",
                self.lock.name()
            );
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The identity is left out: it is what lets a thread release.
        f.debug_struct("LockGuard")
            .field("name", &self.lock.name())
            .field("fencing_token", &self.fence)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

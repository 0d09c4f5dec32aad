//! [`LockGuard`]: proof of holding a lock, released when dropped.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::lock::Lock;

/// Held while the calling thread owns a [`Lock`]; releases one level of it
/// when dropped or [`unlock`](LockGuard::unlock)ed.
///
/// The lock is free for others once the last guard of the holding thread is
/// gone (re-entered locks count levels). Releasing is one script call; it
/// takes at most twice the client's I/O timeout (a pooled connection, then
/// the reply). Dropping a guard logs a failed release with `log::warn!`;
/// call [`unlock`](LockGuard::unlock) to get the error instead.
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
    lease: Duration,
    released: bool,
    /// Raw pointers are `!Send`; the identity is the thread's.
    _not_send: PhantomData<*const ()>,
}

impl LockGuard {
    pub(crate) fn new(lock: Lock, identity: Arc<str>, fence: u64, lease: Duration) -> Self {
        LockGuard {
            lock,
            identity,
            fence,
            lease,
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

    /// Releases this level of the lock and reports the outcome.
    ///
    /// # Errors
    /// [`Error::NotOwner`] when the lock was no longer this thread's (its
    /// lease ran out, or it was force-unlocked): nothing was changed, and a
    /// newer holder keeps the lock. Redis failures otherwise; the lock then
    /// ends with its lease.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.released = true;
        self.lock.release(&self.identity, self.lease).map(drop)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(err) = self.lock.release(&self.identity, self.lease) {
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
            .finish_non_exhaustive()
    }
}

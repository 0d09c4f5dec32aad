//! [`LockGuard`]: proof of holding a lock, released when dropped.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::raw::{self, RawLock, ReleaseOne};
use crate::backend::{Failed, Sent};
use crate::config::validate_lease;
use crate::context::Context;
use crate::error::Error;
use crate::keys::LockKeys;
use crate::lease::{earlier, Claim, FairRun, Grant, LeaseMode, LeaseStatus, Ownerships, Watchdog};
use crate::observe::{Event, HoldKind, LostReason};
use crate::parking::Reservation;
use crate::scripts::lock::HandoffArgs;
use crate::scripts::reply::{HandoffReply, ReleaseReply};

/// The ownership a guard belongs to.
#[derive(Debug)]
pub(super) struct Ownership {
    /// The thread that holds it (the registry files it under it).
    pub(super) thread: Arc<str>,
    /// The identity it is held as in Redis: the thread of this client that
    /// took it there (`thread`, unless it was passed on in memory since).
    pub(super) identity: Arc<str>,
    /// Its fencing token in Redis.
    pub(super) fence: u64,
    /// This hold's fencing token: `fence`, plus one per in-memory hand-off
    /// since Redis issued it.
    pub(super) token: u64,
    /// The ownership's lease mode (that of its first acquisition).
    pub(super) mode: LeaseMode,
    /// Shared by the guards of this ownership (re-entry) and the watchdog.
    pub(super) status: Arc<LeaseStatus>,
    /// A fair lock's, on the guard of the fresh acquisition only: the
    /// waiter that acquisition found first in the queue behind it. The
    /// release names that waiter's list, and wakes it itself when it is
    /// still the head (see `fair/release.lua`); a re-entry's guard released
    /// last, without it, leaves the wake-up to a second call. On an
    /// ownership passed along a run: the run's next in line.
    pub(super) next_in_line: Option<String>,
    /// A fair lock's run of in-memory hand-offs (empty for the others):
    /// the threads of this client the ownership may pass to next, in
    /// queue order, and those it was passed to. The registry keeps it for
    /// the ownership (a re-entry's guard may be released last); read from
    /// there by the last release. Each guard has a copy from its
    /// acquisition too, for a release that finds the ownership lost, and
    /// so no longer recorded.
    pub(super) run: FairRun,
}

/// Held while the calling thread owns a [`Lock`](crate::Lock); releases one level of it
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
#[clippy::has_significant_drop]
pub struct LockGuard {
    context: Arc<Context>,
    raw: Arc<dyn RawLock>,
    keys: Arc<LockKeys>,
    ownership: Ownership,
    released: bool,
    /// When the guard was made; measured only for the event hook.
    acquired: Option<Instant>,
    /// `MutexGuard` is `!Send` (and `Sync`): the identity is the thread's.
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

impl LockGuard {
    pub(super) fn new(
        context: Arc<Context>,
        raw: Arc<dyn RawLock>,
        keys: Arc<LockKeys>,
        ownership: Ownership,
    ) -> Self {
        let acquired = context.observer().is_set().then(Instant::now);
        LockGuard {
            context,
            raw,
            keys,
            ownership,
            released: false,
            acquired,
            _not_send: PhantomData,
        }
    }

    /// Records `run` as its ownership's (see [`Ownership::run`]).
    pub(super) fn start_run(&self, registry: &Ownerships, run: FairRun) {
        let ownership = &self.ownership;
        registry.start_run(&self.keys.lock, &ownership.thread, &ownership.status, run);
    }

    /// What this guard holds, for events.
    pub(super) fn kind(&self) -> HoldKind {
        if self.keys.fair.is_some() {
            HoldKind::FairLock
        } else {
            HoldKind::Lock
        }
    }

    /// The fencing token of this ownership: it grows with every fresh
    /// acquisition of this lock name and stays the same on re-entry. Pass it
    /// to a storage system that rejects writes carrying a token lower than
    /// one it has seen, so that a holder whose lease ran out cannot overwrite
    /// its successor's work.
    pub fn fencing_token(&self) -> u64 {
        self.ownership.token
    }

    /// The name of the lock this guard holds.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Whether the lock can no longer be counted on: the watchdog found it
    /// gone, an `extend` or release was refused, or its validity
    /// ([`valid_until`](LockGuard::valid_until)) passed without a confirmed
    /// renewal (a fixed lease ran out; a renewed one could not be renewed
    /// in time). No network call. `false` is not a promise: the lease may
    /// end the next moment.
    pub fn is_lost(&self) -> bool {
        self.ownership.status.is_lost()
    }

    /// A receiver that gets the [`LostReason`] once, when this hold is
    /// found lost, so that a thread can block or `select!` on the loss
    /// rather than poll [`is_lost`](LockGuard::is_lost): at once if it was
    /// already found lost; within one watchdog round of the watchdog
    /// finding a renewed lease gone, taken over, or unrenewable until its
    /// end; at [`valid_until`](LockGuard::valid_until) for a fixed lease
    /// (a later end, after `extend`). A refused `extend` sends it too.
    ///
    /// Releasing the last guard of the hold (`unlock`, or its drop)
    /// disconnects the receiver without a message, whatever the release
    /// finds: `recv()` then returns `Err`. Each call makes a receiver of
    /// its own, each told once; nothing is made (no channel, no timer)
    /// for a guard that never asks. Wrap it in a [`LostSignal`] to check
    /// it repeatedly, or see [`Lock::using`](crate::Lock::using).
    ///
    /// [`LostSignal`]: crate::LostSignal
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("leader")?.lock()?;
    /// let lost = guard.lost();
    /// // Lead until the lock is lost (or for an hour).
    /// match lost.recv_timeout(Duration::from_secs(3600)) {
    ///     Ok(reason) => eprintln!("no longer the leader: {reason}"),
    ///     Err(_) => guard.unlock()?,
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn lost(&self) -> Receiver<LostReason> {
        let ownership = &self.ownership;
        self.context.lost_signal(
            &ownership.status,
            ownership.mode,
            &self.keys.name,
            self.kind(),
        )
    }

    /// When this hold ends at the latest unless its lease is renewed, by
    /// this process's clock: the lease counted from before the request
    /// that set it was sent, so never later than the lease's end in Redis.
    /// On a quorum of masters (feature `redlock`) it is the Redlock
    /// validity: the lease less the round's time and the clock-drift
    /// allowance. Renewals, `extend` and re-entry move it out. No network
    /// call.
    ///
    /// Work that must not outlive the lock (a write carrying the fencing
    /// token, say) should finish before this instant.
    pub fn valid_until(&self) -> Instant {
        self.ownership.status.valid_until()
    }

    /// Makes the lock live at least `lease` from now: its end moves out,
    /// never in. Owner-checked in Redis: one script call.
    ///
    /// With a fixed lease this pushes its end out (a shorter `lease` than
    /// what is left changes nothing). With a renewed lease the watchdog
    /// keeps renewing as before, so only a `lease` longer than the client's
    /// lease changes anything: the lock then outlives a crash of this
    /// process by that much. Nothing but a release, or the lease running
    /// out, ends an ownership early; see [`Lock::with_fixed_lease`](crate::Lock::with_fixed_lease) for how
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
        let ownership = &self.ownership;
        if self
            .raw
            .renew(&self.keys, &ownership.identity, ownership.fence, lease)?
        {
            let margin = self.raw.clock_margin(lease);
            ownership.status.lives_from(earlier(sent, margin), lease);
            Ok(())
        } else {
            Err(self.lost_error())
        }
    }

    /// The lock's remaining lease, read from Redis (`PTTL`). One script call.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lock is no longer this thread's; Redis
    /// failures.
    pub fn remaining_lease(&self) -> Result<Duration, Error> {
        match self.raw.holder(&self.keys)? {
            Some(holder)
                if holder.owner.as_str() == &*self.ownership.identity
                    && holder.fencing_token == self.ownership.fence =>
            {
                // Every acquisition sets a lease; none means someone ran
                // PERSIST on the key, and it will not end by itself.
                Ok(holder.remaining_lease.unwrap_or(Duration::MAX))
            }
            _ => Err(self.lost_error()),
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
        let released = self.release_once();
        self.announce_release(&released);
        released
    }

    /// Tells the event hook of a release that came to `released`.
    pub(super) fn announce_release(&self, released: &Result<(), Error>) {
        if let Some(acquired) = self.acquired {
            self.context.observer().release_outcome(
                &self.keys.name,
                self.kind(),
                acquired,
                released,
                self.ownership.status.was_told_lost(),
            );
        }
    }

    fn release_once(&mut self) -> Result<(), Error> {
        let Some(left) = self.leave()? else {
            return Ok(());
        };
        let sent = Instant::now();
        let released = self.raw.release(self.release_one(left));
        self.settle_release(released, left, sent)
    }

    /// The release up to what it sends to Redis: withdraws from the
    /// watchdog and, for the last guard, hands the lock to a waiter of this
    /// process if there is one. `Some(left)`: a release leaving `left`
    /// guards must now be sent (and settled with
    /// [`settle_release`](LockGuard::settle_release)); `None`: done.
    pub(super) fn leave(&mut self) -> Result<Option<usize>, Error> {
        self.released = true;
        let context = &self.context;
        let ownership = &self.ownership;
        let registry = &context.leases.registry;
        // Withdraw from the watchdog first, so that it stops renewing (a
        // renewal already in flight finds the lock gone or someone else's,
        // and changes nothing). An ownership that may pass in memory stays
        // recorded until its release is settled: a thread that passed it
        // on then asks Redis for the lock free only, never taking this
        // ownership under its identity for a leftover of its own.
        let left = registry.leave(
            &self.keys.lock,
            &ownership.thread,
            &ownership.status,
            self.raw.passes_in_memory(),
        );
        // Out of time by this clock is not enough to skip the release: the
        // lease may still run in Redis (the clock margin, a renewal on its
        // way), and the release script checks the owner anyway.
        let Some(left) = left.filter(|_| !ownership.status.is_marked_lost()) else {
            // The hold ends here: its loss signal is disconnected, never
            // told (what the release finds is this caller's to hear).
            ownership.status.close_signal();
            if !ownership.run.served().is_empty() {
                // A fair run's: the places it served would stay first in
                // the queue until they end. The release, sent in the
                // background, drops them if the lock is free (it frees
                // nothing but this ownership).
                self.release_later(Instant::now());
            }
            return Err(self.lost_error());
        };
        if left > 0 {
            return Ok(Some(left));
        }
        if self.keys.fair.is_some() && self.raw.passes_in_memory() {
            // A fair lock's last release: the ownership's run, whichever
            // of its guards this is.
            let run = registry.run(&self.keys.lock, &ownership.thread, &ownership.status);
            let ownership = &mut self.ownership;
            if ownership.next_in_line.is_none() {
                ownership.next_in_line = run.next_in_line().map(str::to_owned);
            }
            ownership.run = run;
        }
        let context = &self.context;
        let ownership = &self.ownership;
        // The last guard of a fair lock whose next in line is a parked
        // thread of this process: passed to it in memory when it is next
        // on the ownership's run (nobody of another process arrived
        // before it); else handed to it by the release's script, if it is
        // still the head of the queue. An ownership passed along a run
        // already is released instead, which drops the places of those
        // it was passed to.
        if let Some(reservation) = self.reserve_next_in_line() {
            if self.next_on_run(&reservation.claim) && self.may_pass_to(&reservation.claim) {
                return self.pass(reservation).map(|()| None);
            }
            if ownership.run.served().is_empty() {
                ownership.status.close_signal();
                if self.hand_off(reservation)? {
                    return Ok(None);
                }
            } else {
                reservation.fail();
            }
        }
        // The last guard: hand the lock to a waiter of this process if
        // there is one (and the run of local hand-offs is not too long).
        if let Some(reservation) = context.lock_room.reserve(&self.keys.baton) {
            if self.may_pass_to(&reservation.claim) {
                return self.pass(reservation).map(|()| None);
            }
            ownership.status.close_signal();
            return self.hand_off(reservation).map(|_| None);
        }
        ownership.status.close_signal();
        context.lock_room.released_globally(&self.keys.baton);
        Ok(Some(0))
    }

    /// A fair lock's: reserves the waiter this ownership's acquisition
    /// found next in line, if it is a thread of this process waiting now.
    fn reserve_next_in_line(&self) -> Option<Reservation<Claim, Grant>> {
        let next = self.ownership.next_in_line.as_deref()?;
        self.context
            .lock_room
            .reserve_parker(&self.keys.wake_list(next))
    }

    /// A fair lock's: whether the waiter of `claim` is the next on this
    /// ownership's run, the line of this client's waiters first in the
    /// queue when Redis last issued the ownership.
    fn next_on_run(&self, claim: &Claim) -> bool {
        let next = self.ownership.run.ahead().first();
        next.is_some_and(|(waiter, _)| **waiter == *claim.identity)
    }

    /// Whether this ownership may pass in memory, as it is, to the waiter
    /// of `claim`: a waiter asking for the same renewed lease (a fixed
    /// lease counts from its own acquisition; another renewed lease is
    /// another crash window), while tokens set aside for it in Redis
    /// remain (a fair lock's waiter must be next on its run, too).
    fn may_pass_to(&self, claim: &Claim) -> bool {
        let ownership = &self.ownership;
        let reserve = u64::from(self.reserve());
        claim.takes_passed
            && self.raw.passes_in_memory()
            && claim.mode == ownership.mode
            && matches!(ownership.mode, LeaseMode::Renewed(_))
            && ownership.token < ownership.fence.saturating_add(reserve)
    }

    /// Passes this ownership to the reserved waiter in memory: Redis is not
    /// told; the waiter holds it under the next token (a fair lock's
    /// waiter, parked in Redis, has its park ended).
    fn pass(&self, reservation: Reservation<Claim, Grant>) -> Result<(), Error> {
        let ownership = &self.ownership;
        let passed = self.context.leases.registry.pass(
            &self.keys.lock,
            &ownership.thread,
            &ownership.status,
            &reservation.claim.identity,
        );
        match passed {
            Some((passed, due)) => {
                // This hold ends: its receivers are disconnected, the next
                // holder's made afresh.
                ownership.status.hand_over_signal();
                let parks_on = reservation.parks_on.clone();
                reservation.grant(Grant::Passed(passed));
                if let Some(list) = &parks_on {
                    self.raw.end_park(&self.keys, list);
                }
                // Renewals go on for the new holder (the watchdog left the
                // ownership alone while it had no guard).
                if let Some(due) = due {
                    Watchdog::wake(&self.context.leases, Some(due));
                }
                Ok(())
            }
            // Found lost meanwhile: the waiter looks at the lock itself.
            None => {
                reservation.fail();
                ownership.status.close_signal();
                Err(self.lost_error())
            }
        }
    }

    /// The tokens a fresh ownership sets aside in Redis for in-memory
    /// hand-offs (see `lib/next_fence.lua`).
    fn reserve(&self) -> u32 {
        reserve(&self.context, &*self.raw)
    }

    /// The last release of an ownership that may pass in memory is
    /// settled: it is no longer recorded.
    fn settled(&self) {
        if self.raw.passes_in_memory() {
            let ownership = &self.ownership;
            self.context.leases.registry.forget(
                &self.keys.lock,
                &ownership.thread,
                &ownership.status,
            );
        }
    }

    /// The release [`leave`](LockGuard::leave) asked for, leaving `left`
    /// guards, for a batch of releases sent together.
    pub(super) fn release_one(&self, left: usize) -> ReleaseOne<'_> {
        ReleaseOne {
            keys: &self.keys,
            identity: &self.ownership.identity,
            fence: self.ownership.fence,
            guards_left: left,
            lease: self.ownership.mode.lease(),
            next_in_line: self.ownership.next_in_line.as_deref(),
            served: self.ownership.run.served(),
        }
    }

    /// What a release sent at `sent`, leaving `left` guards, came to.
    pub(super) fn settle_release(
        &self,
        released: Result<Sent<ReleaseReply>, Failed>,
        left: usize,
        sent: Instant,
    ) -> Result<(), Error> {
        if left == 0 {
            self.settled();
        }
        match released {
            Ok(Sent {
                value: ReleaseReply::Inner { .. },
                ..
            }) => {
                // The inner release made the lock live at least the
                // ownership's lease more.
                let lease = self.ownership.mode.lease();
                let sent = earlier(sent, self.raw.clock_margin(lease));
                self.ownership.status.lives_from(sent, lease);
                Ok(())
            }
            Ok(Sent {
                value: ReleaseReply::Released,
                ..
            }) => Ok(()),
            // Free on a majority of a quorum's masters; the others get the
            // release in the background, so that waiters parked there wake.
            Ok(Sent {
                value: ReleaseReply::ReleasedInPart,
                ..
            }) => {
                self.release_later(sent);
                Ok(())
            }
            // Sent twice and "not the owner" the second time: the first
            // send, cut off on its way back, may have released it.
            Ok(Sent {
                value: ReleaseReply::NotOwner,
                resent: true,
            }) => Ok(()),
            Ok(Sent {
                value: ReleaseReply::NotOwner,
                ..
            }) => Err(self.lost_error()),
            Err(failed) => {
                // A last release that did not land is finished in the
                // background, so that the lock is free as soon as Redis
                // answers, not when its lease ends.
                let error = failed.error;
                if left == 0 && (error.is_transient() || error.is_timeout()) {
                    self.release_later(sent);
                }
                Err(error)
            }
        }
    }

    /// Hands this ownership's last release to the watchdog thread.
    fn release_later(&self, sent: Instant) {
        let ownership = &self.ownership;
        let cleanup = raw::release_later(
            &self.raw,
            &self.keys,
            &ownership.identity,
            ownership.fence,
            ownership.mode.lease(),
            ownership.run.served().to_vec(),
            sent,
        );
        self.context.finish_later(cleanup);
    }

    /// Passes the lock to the reserved local waiter; whether it did (not:
    /// a fair lock's waiter that is no longer the head, and nothing
    /// changed, so the caller releases as usual). On failure the waiter
    /// looks at the lock itself: if the hand-off happened unseen, its
    /// attempt finds the lock under its identity and takes it afresh; if
    /// not, the watchdog thread frees this ownership once Redis answers.
    fn hand_off(&self, reservation: Reservation<Claim, Grant>) -> Result<bool, Error> {
        let request = self.context.next_request();
        let ownership = &self.ownership;
        let args = HandoffArgs {
            from: &ownership.identity,
            fence: ownership.fence,
            to: &reservation.claim.identity,
            lease: reservation.claim.mode.lease(),
            fence_ttl: self.context.config.fence_ttl,
            request,
            proposed_token: 0,
            reserve: self.reserve(),
        };
        // A reserved parker's list: its park ends once the lock is its
        // own, or may be.
        let parks_on = reservation.parks_on.clone();
        let end_park = || {
            if let Some(list) = &parks_on {
                self.raw.end_park(&self.keys, list);
            }
        };
        let sent = Instant::now();
        let handed = self.raw.hand_off(&self.keys, args);
        let release_instead = match &handed {
            Ok(Sent { value, .. }) => value.not_head,
            // A fair lock's hand-off Redis refused before it changed
            // anything (`TRYAGAIN` while the slot migrates, `BUSY`): the
            // release, which has its own way through a migration, goes
            // as usual.
            Err(failed) => self.keys.fair.is_some() && !failed.outcome_unknown,
        };
        if release_instead {
            reservation.fail();
            return Ok(false);
        }
        self.settled();
        match handed {
            Ok(Sent {
                value:
                    HandoffReply {
                        fence: Some(fence),
                        next_in_line,
                        in_part,
                        ..
                    },
                ..
            }) => {
                if in_part {
                    // Masters that did not answer may keep this ownership's
                    // copy: released there in the background (owner- and
                    // token-checked: the waiter's copies stay).
                    self.release_later(sent);
                }
                // The new lease as the slowest clock may count it.
                let sent = earlier(sent, self.raw.clock_margin(args.lease));
                reservation.grant(Grant::Fresh {
                    fence,
                    sent,
                    next_in_line,
                });
                end_park();
                Ok(true)
            }
            // Sent twice, and the second found the lock no longer ours: the
            // first may have handed it over. The waiter looks for itself.
            Ok(Sent {
                value: HandoffReply { fence: None, .. },
                resent: true,
            }) => {
                reservation.fail();
                end_park();
                Ok(true)
            }
            Ok(Sent {
                value: HandoffReply { fence: None, .. },
                ..
            }) => {
                reservation.fail();
                Err(self.lost_error())
            }
            Err(failed) => {
                // Free the lock from this ownership if it still has it, and
                // from the waiter if the hand-off gave it the lock unseen.
                self.release_later(sent);
                let claim = &reservation.claim;
                let undo = raw::undo_later(
                    &self.raw,
                    &self.keys,
                    &claim.identity,
                    request,
                    claim.mode.lease(),
                    sent,
                );
                self.context.finish_later(undo);
                reservation.fail();
                end_park();
                Err(failed.error)
            }
        }
    }

    /// Marks this ownership lost and makes the error for it.
    fn lost_error(&self) -> Error {
        let ownership = &self.ownership;
        if ownership.status.mark_lost(LostReason::NotHeld) {
            log::warn!("redbaton: lock {:?} was lost", self.keys.name);
            self.context.observer().emit(|| Event::Lost {
                name: &self.keys.name,
                kind: self.kind(),
                reason: LostReason::NotHeld,
            });
        }
        self.context
            .leases
            .registry
            .forget(&self.keys.lock, &ownership.thread, &ownership.status);
        Error::LockLost {
            name: self.keys.name.clone(),
        }
    }
}

/// The tokens a fresh ownership of `raw`'s sets aside in Redis for
/// in-memory hand-offs: one per local hand-off a run may make before the
/// lock goes through Redis again (none where nothing passes in memory).
pub(super) fn reserve(context: &Context, raw: &dyn RawLock) -> u32 {
    if raw.passes_in_memory() {
        context.config.max_local_handoffs
    } else {
        0
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
                self.keys.name
            );
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The identity is left out: it is what lets a thread release.
        f.debug_struct("LockGuard")
            .field("name", &self.keys.name)
            .field("fencing_token", &self.ownership.token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

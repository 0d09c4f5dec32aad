//! What a client tells an observer: the [`Event`]s of
//! [`ClientBuilder::on_event`](crate::ClientBuilder::on_event), and the
//! [`LostReason`] a guard's loss signal carries.
//!
//! Below every layer that has something to tell (the backend's slot maps,
//! sentinels and suspect masters, the wait core, the watchdog, the guards):
//! each holds the client's [`Observer`], a pointer that is `None` unless a
//! hook was set, so that an unset hook costs one branch where an event
//! would be made.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

/// Why a guard's hold ended without its release: what a guard's
/// `lost()` channel delivers, and what [`Event::Lost`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The hold's validity passed without a renewal: a fixed lease (or the
    /// end an `extend` gave it) ran out.
    LeaseEnded,
    /// Redis stayed unreachable, or answered "not now" (`BUSY`,
    /// `LOADING`, ...), until the lease ended: the watchdog could not
    /// renew it in time.
    Unreachable,
    /// Redis no longer has the hold: its key was deleted
    /// (`force_unlock`, `DEL`, `FLUSHDB`), evicted, expired on the server,
    /// or lost in a failover to a replica that never had it.
    Gone,
    /// The key now holds someone else's ownership (taken by another owner
    /// after a `force_unlock`, overwritten, or taken afresh by this very
    /// thread).
    TakenOver,
    /// Redis answered that the hold is no longer this thread's, without
    /// telling which of [`Gone`](LostReason::Gone) and
    /// [`TakenOver`](LostReason::TakenOver) happened: what read holds,
    /// permits and a quorum of masters report, what a refused `extend`
    /// or release reports, and what a lock reports when more than eight
    /// were found lost in one renewal round (telling them apart takes a
    /// round trip each).
    NotHeld,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::LeaseEnded => "its lease ended without a renewal",
            LostReason::Unreachable => "Redis stayed unreachable or busy until the lease ended",
            LostReason::Gone => "its key is gone from Redis",
            LostReason::TakenOver => "its key holds another ownership",
            LostReason::NotHeld => "Redis says it is no longer this thread's",
        })
    }
}

/// A guard's loss signal as a cancellation handle: what
/// [`Lock::using`](crate::Lock::using) hands its closure, and what any
/// guard's `lost()` receiver becomes with [`LostSignal::new`]. Checking it
/// is cheap (no network call); waiting on it blocks until the loss, the
/// guard's release, or a timeout.
///
/// `Send + Sync`: share it (by reference, in a scoped thread) with the
/// threads that do the guarded work.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("reindex")?;
/// let done = lock.using(|lost| {
///     for batch in 0..100 {
///         if lost.is_lost() {
///             return None; // stop: another holder may be running
///         }
///         // ... one batch, then a pause that ends early on a loss ...
///         if lost.wait_timeout(Duration::from_millis(10)).is_some() {
///             return None;
///         }
///         let _ = batch;
///     }
///     Some(100)
/// })?;
/// # let _ = done;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LostSignal {
    receiver: Receiver<LostReason>,
    /// The reason, once received (the channel delivers it once).
    reason: OnceLock<LostReason>,
}

impl LostSignal {
    /// The handle on a guard's `lost()` receiver.
    pub fn new(receiver: Receiver<LostReason>) -> Self {
        LostSignal {
            receiver,
            reason: OnceLock::new(),
        }
    }

    /// Why the hold was lost, if it was found lost so far. No network
    /// call, no wait.
    pub fn reason(&self) -> Option<LostReason> {
        if let Some(reason) = self.reason.get() {
            return Some(*reason);
        }
        match self.receiver.try_recv() {
            Ok(reason) => Some(*self.reason.get_or_init(|| reason)),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => self.reason.get().copied(),
        }
    }

    /// Whether the hold was found lost so far.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Waits until the hold is found lost (its reason), the guard is
    /// released, or `timeout` passes (`None` for both).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<LostReason> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_until(deadline),
            None => self.wait(),
        }
    }

    /// Waits until the hold is found lost (its reason), the guard is
    /// released, or `deadline` passes (`None` for both).
    pub fn wait_until(&self, deadline: Instant) -> Option<LostReason> {
        if let Some(reason) = self.reason() {
            return Some(reason);
        }
        match self.receiver.recv_deadline(deadline) {
            Ok(reason) => Some(*self.reason.get_or_init(|| reason)),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                self.reason.get().copied()
            }
        }
    }

    /// Waits until the hold is found lost (its reason) or the guard is
    /// released (`None`). Without a deadline: a renewed hold may last as
    /// long as its guard.
    pub fn wait(&self) -> Option<LostReason> {
        if let Some(reason) = self.reason() {
            return Some(reason);
        }
        match self.receiver.recv() {
            Ok(reason) => Some(*self.reason.get_or_init(|| reason)),
            Err(_) => self.reason.get().copied(),
        }
    }

    /// The receiver, to wait on it with others in `crossbeam_channel`'s
    /// `select!`. A message taken from it here is not seen by
    /// [`reason`](LostSignal::reason) afterwards.
    pub fn receiver(&self) -> &Receiver<LostReason> {
        &self.receiver
    }
}

/// What kind of hold an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldKind {
    /// A [`Lock`](crate::Lock) made by [`Client::lock`](crate::Client::lock).
    Lock,
    /// A [`Lock`](crate::Lock) made by
    /// [`Client::fair_lock`](crate::Client::fair_lock).
    FairLock,
    /// A read hold of an [`RwLock`](crate::RwLock).
    Read,
    /// A write hold of an [`RwLock`](crate::RwLock).
    Write,
    /// The upgradable read of an [`RwLock`](crate::RwLock).
    Upgradable,
    /// Permits of a [`Semaphore`](crate::Semaphore).
    Permits,
}

/// How an acquisition got its hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Acquisition {
    /// The first attempt won (or re-entered a hold of this thread): no
    /// wait.
    FirstAttempt,
    /// An attempt made while waiting won: after a baton, a park's end, or a
    /// turn in the local queue.
    AfterWaiting,
    /// A releasing thread of this client handed it over (no round trip
    /// for the waiter).
    LocalHandoff,
}

/// Something a client did or found, as told to the hook set with
/// [`ClientBuilder::on_event`](crate::ClientBuilder::on_event).
///
/// The names borrow from the client for the duration of the call; copy
/// what you keep. New variants and fields may come in minor versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A guard (or permit) was made.
    #[non_exhaustive]
    Acquired {
        /// The synchronizer's name.
        name: &'a str,
        /// What is held.
        kind: HoldKind,
        /// From the call to the hold (zero for a first attempt's win, up
        /// to the round trip).
        waited: Duration,
        /// The hold's fencing token, for the kinds that have one (locks,
        /// write holds).
        fencing_token: Option<u64>,
        /// How the hold was got.
        how: Acquisition,
    },
    /// A guard was released (by `unlock`, `release` or its drop) and Redis
    /// confirmed it, or a local waiter was handed the hold.
    #[non_exhaustive]
    Released {
        /// The synchronizer's name.
        name: &'a str,
        /// What was held.
        kind: HoldKind,
        /// From the acquisition to the release.
        held: Duration,
    },
    /// A hold was found lost, with why (sent once per hold).
    #[non_exhaustive]
    Lost {
        /// The synchronizer's name.
        name: &'a str,
        /// What was held.
        kind: HoldKind,
        /// Why.
        reason: LostReason,
    },
    /// A guard's release failed on something other than a loss (Redis
    /// unreachable or busy, most often): the guard is gone, and the hold
    /// is freed in the background (told just before, as
    /// [`ReleaseRetried`](Event::ReleaseRetried)) or ends with its lease.
    /// Each hold ends in one of `Released`, `Lost` and `ReleaseFailed`.
    #[non_exhaustive]
    ReleaseFailed {
        /// The synchronizer's name.
        name: &'a str,
        /// What was held.
        kind: HoldKind,
        /// From the acquisition to the release.
        held: Duration,
    },
    /// A watchdog renewal could not reach Redis (or Redis said "not
    /// now"); it is tried again until the lease would end.
    #[non_exhaustive]
    RenewalFailed {
        /// The synchronizer's name.
        name: &'a str,
        /// What is held.
        kind: HoldKind,
    },
    /// A release (or the undoing of an acquisition whose reply was lost)
    /// did not land and is sent again by the client's background thread.
    #[non_exhaustive]
    ReleaseRetried {
        /// The synchronizer's name.
        name: &'a str,
    },
    /// A thread found the object taken and started waiting for it.
    #[non_exhaustive]
    Parked {
        /// The synchronizer's name.
        name: &'a str,
        /// What it waits to hold; `None` for a latch's wait (it holds
        /// nothing once the count reaches zero).
        kind: Option<HoldKind>,
    },
    /// A waiting thread stopped waiting: it is about to hold the object,
    /// or its deadline passed, or Redis failed.
    #[non_exhaustive]
    Woken {
        /// The synchronizer's name.
        name: &'a str,
        /// How long it waited.
        waited: Duration,
    },
    /// A waiting thread's deadline passed before it got the object (a
    /// `try_*_for` or `try_*_until` that returns without it, a latch's
    /// timed wait that ends before the count reaches zero); told after its
    /// [`Woken`](Event::Woken).
    #[non_exhaustive]
    TimedOut {
        /// The synchronizer's name.
        name: &'a str,
        /// How long it waited.
        waited: Duration,
    },
    /// An acquisition gave up on an error, which its caller gets (Redis
    /// unreachable or busy until the deadline, a key of another type, a
    /// refused script): the end of a call that neither acquired nor timed
    /// out. Told when a wait ends so (after its [`Woken`](Event::Woken)),
    /// and when the first attempt of a lock, a fair lock or a semaphore
    /// fails before any wait.
    #[non_exhaustive]
    AcquireFailed {
        /// The synchronizer's name.
        name: &'a str,
        /// What it was to hold.
        kind: HoldKind,
        /// From the call (or, when a wait failed, from the wait's start)
        /// to the failure.
        waited: Duration,
    },
    /// A cluster's slot map was loaded again (after a `MOVED` or a
    /// connection failure).
    #[non_exhaustive]
    SlotMapReloaded,
    /// The sentinels reported a new master (`+switch-master`): the next
    /// call looks it up.
    #[non_exhaustive]
    MasterSwitched {
        /// The sentinels' service name.
        service: &'a str,
    },
    /// A master of a Redlock quorum stopped answering: left out of rounds
    /// while the others make a majority.
    #[non_exhaustive]
    MasterSuspect {
        /// The master's address.
        master: &'a str,
    },
    /// A suspect master of a Redlock quorum answers again.
    #[non_exhaustive]
    MasterBack {
        /// The master's address.
        master: &'a str,
    },
}

/// The type of an event hook.
pub(crate) type Hook = dyn Fn(&Event<'_>) + Send + Sync;

/// The client's observer: its hooks, if any was set.
#[derive(Clone, Default)]
pub(crate) struct Observer(Option<Arc<Inner>>);

struct Inner {
    /// Called in the order they were added.
    hooks: Vec<Arc<Hook>>,
    /// Set by the first panic of a hook, which is logged; the later ones
    /// are not (a hook that always panics must not flood the log).
    panicked: AtomicBool,
}

impl Observer {
    /// This observer with `hook` called after its hooks.
    pub(crate) fn with(self, hook: Arc<Hook>) -> Self {
        let mut hooks = self.0.map(|inner| inner.hooks.clone()).unwrap_or_default();
        hooks.push(hook);
        Observer(Some(Arc::new(Inner {
            hooks,
            panicked: AtomicBool::new(false),
        })))
    }

    /// Whether a hook is set: what to check before measuring something
    /// only an event needs.
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Tells the hooks the event `make` makes; makes nothing without a
    /// hook. A panic of a hook is caught here (logged the first time):
    /// the next hooks are called, and the caller's work goes on.
    #[inline]
    pub(crate) fn emit<'a>(&self, make: impl FnOnce() -> Event<'a>) {
        if let Some(inner) = &self.0 {
            inner.call(&make());
        }
    }

    /// Tells the hooks that an acquisition of `kind` on `name` that started
    /// at `start` (`None`: no hook was set then) failed before any wait. A
    /// wait that fails is told by the wait core.
    pub(crate) fn acquire_failed(&self, name: &str, kind: HoldKind, start: Option<Instant>) {
        if let Some(start) = start {
            self.emit(|| Event::AcquireFailed {
                name,
                kind,
                waited: start.elapsed(),
            });
        }
    }

    /// Tells the hooks how the release of a hold (of `kind` on `name`,
    /// made at `acquired`) came out: `Released`, or `ReleaseFailed` when
    /// Redis failed. Nothing for a hold found lost: its `Lost` event ended
    /// it, told either before this release (`told_lost`: a fixed lease's
    /// end, a renewal that found it gone) or by this release, whose error
    /// says so. So each hold ends in exactly one event.
    pub(crate) fn release_outcome(
        &self,
        name: &str,
        kind: HoldKind,
        acquired: Instant,
        outcome: &Result<(), crate::error::Error>,
        told_lost: bool,
    ) {
        if told_lost {
            return;
        }
        match outcome {
            Ok(()) => self.emit(|| Event::Released {
                name,
                kind,
                held: acquired.elapsed(),
            }),
            Err(err) if err.is_lost() => {}
            Err(_) => self.emit(|| Event::ReleaseFailed {
                name,
                kind,
                held: acquired.elapsed(),
            }),
        }
    }
}

impl Inner {
    fn call(&self, event: &Event<'_>) {
        for hook in &self.hooks {
            let called = panic::catch_unwind(AssertUnwindSafe(|| hook(event)));
            if called.is_err() && !self.panicked.swap(true, Ordering::Relaxed) {
                log::error!(
                    "redbaton: the event hook panicked on {event:?}; its panics are caught, and \
                     the later ones are not logged"
                );
            }
        }
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hooks = self.0.as_ref().map_or(0, |inner| inner.hooks.len());
        f.debug_struct("Observer").field("hooks", &hooks).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn an_unset_observer_makes_no_event() {
        Observer::default().emit(|| unreachable!("made without a hook"));
    }

    #[test]
    fn a_panicking_hook_is_caught_and_called_again() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let observer = Observer::default().with(Arc::new(move |_: &Event<'_>| {
            counted.fetch_add(1, Ordering::Relaxed);
            panic!("hook");
        }));
        observer.emit(|| Event::SlotMapReloaded);
        observer.emit(|| Event::SlotMapReloaded);
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn every_hook_is_called_in_order_even_after_a_panic() {
        let calls = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (first, second) = (Arc::clone(&calls), Arc::clone(&calls));
        let observer = Observer::default()
            .with(Arc::new(move |_: &Event<'_>| {
                first.lock().push(1);
                panic!("first hook");
            }))
            .with(Arc::new(move |_: &Event<'_>| second.lock().push(2)));
        observer.emit(|| Event::SlotMapReloaded);
        assert_eq!(*calls.lock(), [1, 2]);
    }
}

//! The lease keeper: one thread per client, started when the first renewed
//! lock is taken (or the first clean-up is needed), stopped when the client
//! is dropped.
//!
//! It sleeps until the earliest renewal is due (or a message arrives over
//! its channel), then renews in one pipeline every ownership due within the
//! next sixth of its lease, so locks taken at nearby moments share a round
//! trip. A renewal that finds the lock is no longer the ownership's marks it
//! lost; one that cannot reach Redis, or that Redis answers with "not now"
//! (`BUSY`, `LOADING`, ...), is retried until the lease would have ended,
//! then marks it lost. A round waits for its replies three quarters of the
//! time left to its shortest-lived hold at most (not the whole I/O
//! timeout), and a retry comes a tenth of the lease on, or sooner where
//! the hold ends sooner (a grant's, see `sync::lock`): so that one lost
//! reply does not cost a short-lived hold its life.
//!
//! It also finishes what a caller could not: a release whose reply was lost
//! or that the replicas did not confirm (`replica_acks`; sent again to
//! whichever master is current),
//! or an acquisition whose reply was lost (which may have taken the lock for
//! nobody), is sent again until Redis answers or the lease it concerns has
//! ended anyway. Both are safe to send any number of times.
//!
//! The thread holds only a `Weak` to the [`LeaseRuntime`], not to the
//! client, and no lock of the client while it talks to Redis.

use std::fmt;
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use super::{earlier, DueRenewal, LeaseRuntime, LeaseStatus, RenewOutcome, RenewRequest};
use crate::backend::answered_by;
use crate::error::Error;
use crate::observe::{Event, HoldKind, LostReason};

/// Name of the renewal thread, as seen in debuggers and `/proc`.
pub(crate) const THREAD_NAME: &str = "redbaton-watchdog";

/// Counters of the watchdog's work, for operations and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchdogStats {
    /// Renewal rounds sent (one pipeline, one round trip each).
    pub rounds: u64,
    /// Leases renewed.
    pub renewals: u64,
    /// Ownerships found lost (by renewal, or after Redis stayed unreachable
    /// until the lease ended).
    pub losses: u64,
}

/// The client's side of the watchdog.
#[derive(Debug)]
pub(crate) struct Watchdog {
    wake: Sender<()>,
    /// Taken by the thread when it starts.
    receiver: Mutex<Option<Receiver<()>>>,
    /// Releases to finish; see [`Cleanup`].
    cleanups: Mutex<Vec<Cleanup>>,
    /// When the thread will next wake by itself (`None`: only on a
    /// message). Written by the thread and read by `wake` under this lock,
    /// so that a new ownership due no earlier needs no message.
    scheduled: Mutex<Option<Instant>>,
    /// Updated once per round, so that a reader never sees a round counted
    /// without its renewals.
    stats: Mutex<WatchdogStats>,
    /// Fixed leases whose loss signal was asked for: told at their end.
    expiries: Mutex<Vec<Expiry>>,
}

/// A fixed lease whose guard's `lost()` was called: its receivers are told
/// [`LostReason::LeaseEnded`] when its validity passes. Weak, so that the
/// guards' release drops it.
#[derive(Debug)]
struct Expiry {
    status: Weak<LeaseStatus>,
    name: Arc<str>,
    kind: HoldKind,
}

/// A release that must still reach Redis: its first send failed with the
/// outcome unknown, and until it lands the lock may be held by nobody's
/// guard.
pub(crate) struct Cleanup {
    /// The lock's name, for messages.
    name: Arc<str>,
    /// Sends the release once; safe to call again (it runs release.lua or
    /// release_request.lua, which check owner and token or request).
    send: Box<dyn FnMut() -> Result<(), Error> + Send>,
    /// When the lease it concerns has ended for sure: nothing left to do.
    give_up_at: Instant,
    next_try: Instant,
}

impl Cleanup {
    /// `send` frees what may be left of an ownership of lock `name` whose
    /// lease is `lease` at the longest, counted from `sent`.
    pub(crate) fn new(
        name: &str,
        sent: Instant,
        lease: Duration,
        send: impl FnMut() -> Result<(), Error> + Send + 'static,
    ) -> Self {
        Cleanup {
            name: name.into(),
            send: Box::new(send),
            give_up_at: sent + lease,
            next_try: Instant::now(),
        }
    }
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cleanup")
            .field("name", &self.name)
            .field("give_up_at", &self.give_up_at)
            .finish_non_exhaustive()
    }
}

/// Clean-ups kept at most; a Redis down for long with many failing callers
/// must not grow memory without bound (the oldest ones, whose leases end
/// first, are dropped: those locks end with their lease).
const MAX_CLEANUPS: usize = 10_000;

/// Losses per round whose reason the watchdog asks Redis for (one round
/// trip each, `RenewLeases::why_lost`); the others are `NotHeld`.
const EXPLAINED_PER_ROUND: usize = 8;

/// Pause between tries of a clean-up while Redis does not answer.
const CLEANUP_RETRY: Duration = Duration::from_millis(50);

impl Watchdog {
    pub(crate) fn new() -> Self {
        let (wake, receiver) = crossbeam_channel::unbounded();
        Watchdog {
            wake,
            receiver: Mutex::new(Some(receiver)),
            cleanups: Mutex::new(Vec::new()),
            scheduled: Mutex::new(None),
            stats: Mutex::new(WatchdogStats::default()),
            expiries: Mutex::new(Vec::new()),
        }
    }

    /// Has the thread tell the loss signal of the fixed lease `status` (of
    /// `name`) when its validity passes, unless it is told or released
    /// before.
    pub(crate) fn watch_expiry(
        runtime: &Arc<LeaseRuntime>,
        status: &Arc<LeaseStatus>,
        name: Arc<str>,
        kind: HoldKind,
    ) {
        runtime.watchdog.expiries.lock().push(Expiry {
            status: Arc::downgrade(status),
            name,
            kind,
        });
        Watchdog::wake(runtime, Some(status.valid_until()));
    }

    /// When the earliest watched fixed lease ends; forgets those released
    /// or told.
    fn next_expiry(&self) -> Option<Instant> {
        let mut expiries = self.expiries.lock();
        expiries.retain(|e| e.status.upgrade().is_some_and(|s| s.is_watched()));
        expiries
            .iter()
            .filter_map(|e| e.status.upgrade())
            .map(|s| s.valid_until())
            .min()
    }

    /// Tells the thread (starting it the first time) that a new ownership
    /// needs renewing from `due` on, or (`None`) that a clean-up is
    /// waiting. A renewal due no earlier than the thread's next wake-up
    /// needs no message: most acquisitions cost no thread switch.
    pub(crate) fn wake(runtime: &Arc<LeaseRuntime>, due: Option<Instant>) {
        let watchdog = &runtime.watchdog;
        let started = watchdog.receiver.lock().is_none();
        if started && due.is_some_and(|due| watchdog.scheduled.lock().is_some_and(|at| at <= due)) {
            return;
        }
        if let Some(receiver) = runtime.watchdog.receiver.lock().take() {
            let weak = Arc::downgrade(runtime);
            let spawned = thread::Builder::new()
                .name(THREAD_NAME.to_owned())
                .spawn(move || run(&weak, &receiver));
            if let Err(err) = spawned {
                // Without the thread, renewed locks end at their lease:
                // reported on the guard as lost, like any failed renewal.
                log::error!("redbaton: cannot start the watchdog thread: {err}");
            }
        }
        // The thread may not be listening yet; the message waits for it.
        let _ = runtime.watchdog.wake.send(());
    }

    /// Hands a release that could not be confirmed to the thread.
    pub(crate) fn clean_up(runtime: &Arc<LeaseRuntime>, cleanup: Cleanup) {
        runtime.observer.emit(|| Event::ReleaseRetried {
            name: &cleanup.name,
        });
        {
            let mut cleanups = runtime.watchdog.cleanups.lock();
            if cleanups.len() >= MAX_CLEANUPS {
                let dropped = cleanups.remove(0);
                log::warn!(
                    "redbaton: too many releases waiting for Redis; lock {:?} ends with its lease",
                    dropped.name
                );
            }
            cleanups.push(cleanup);
        }
        Watchdog::wake(runtime, None);
    }

    pub(crate) fn stats(&self) -> WatchdogStats {
        *self.stats.lock()
    }

    fn next_cleanup(&self) -> Option<Instant> {
        self.cleanups.lock().iter().map(|c| c.next_try).min()
    }
}

/// The thread's body: ends when the client is gone.
fn run(runtime: &Weak<LeaseRuntime>, wake: &Receiver<()>) {
    loop {
        let next_due = match runtime.upgrade() {
            Some(runtime) => {
                // Under the lock `wake` reads, so that an ownership added
                // after this look either is in it or gets a message.
                let mut scheduled = runtime.watchdog.scheduled.lock();
                *scheduled = [
                    runtime.registry.next_renewal(),
                    runtime.watchdog.next_cleanup(),
                    runtime.watchdog.next_expiry(),
                ]
                .into_iter()
                .flatten()
                .min();
                *scheduled
            }
            None => return,
        };
        // With nothing to do, sleep until a message: the channel
        // disconnects when the client is dropped, which ends the wait.
        let woken = match next_due {
            Some(due) => wake.recv_deadline(due),
            None => wake.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match woken {
            Ok(()) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let Some(runtime) = runtime.upgrade() else {
            return;
        };
        // Renewals first: a clean-up the replicas do not confirm waits
        // for them (`WAIT`) on this thread.
        renew_due(&runtime);
        expire_due(&runtime);
        clean_up_due(&runtime);
        if let Some(name) = &runtime.name {
            name.refresh_if_due();
        }
    }
}

/// Sends every clean-up whose time has come, once each, until a renewal
/// is due: under `replica_acks` each may wait for its `WAIT`, and many of
/// them must not make renewals late. The rest go at the next wake-up.
fn clean_up_due(runtime: &LeaseRuntime) {
    let now = Instant::now();
    let due: Vec<Cleanup> = {
        let mut cleanups = runtime.watchdog.cleanups.lock();
        let (due, later) = cleanups.drain(..).partition(|c| c.next_try <= now);
        *cleanups = later;
        due
    };
    let mut due = due.into_iter();
    while let Some(mut cleanup) = due.next() {
        if runtime
            .registry
            .next_renewal()
            .is_some_and(|at| at <= Instant::now())
        {
            let mut cleanups = runtime.watchdog.cleanups.lock();
            cleanups.push(cleanup);
            cleanups.extend(due);
            return;
        }
        match (cleanup.send)() {
            Ok(()) => log::debug!(
                "redbaton: finished an unconfirmed release of {:?}",
                cleanup.name
            ),
            Err(err) if err.is_transient() && Instant::now() < cleanup.give_up_at => {
                cleanup.next_try = Instant::now() + CLEANUP_RETRY;
                runtime.watchdog.cleanups.lock().push(cleanup);
            }
            Err(err) if err.is_transient() => {}
            Err(err) => log::warn!(
                "redbaton: cannot finish the release of {:?}; it ends with its lease: {err}",
                cleanup.name
            ),
        }
    }
}

/// One round: renews every ownership due soon, in one round per protocol
/// (one pipeline per server where the protocol allows).
fn renew_due(runtime: &LeaseRuntime) {
    let now = Instant::now();
    let mut due = runtime.registry.due_renewals(now);
    if due.is_empty() {
        return;
    }
    // Ownerships renewed by the same protocol go out together.
    due.sort_by_key(|d| Arc::as_ptr(&d.leased.renewer).cast::<()>());
    let mut round = WatchdogStats::default();
    let mut explained = 0;
    for group in due.chunk_by(|a, b| Arc::ptr_eq(&a.leased.renewer, &b.leased.renewer)) {
        let requests: Vec<RenewRequest<'_>> = group
            .iter()
            .map(|d| RenewRequest {
                name: &d.leased.name,
                key: &d.leased.key,
                identity: &d.identity,
                fence: d.fence,
                lease: d.renewal.lease,
            })
            .collect();
        let sent = Instant::now();
        // A reply that comes after the shortest-lived hold of the round has
        // ended is no use to it: the round ends sooner, leaving that hold
        // time for another (a grant lives 2 s, less than a lost reply's
        // timeout by default). Long-lived holds' rounds keep the I/O
        // timeout.
        let shortest = group
            .iter()
            .map(|d| d.status.valid_until().saturating_duration_since(sent))
            .min()
            .unwrap_or_default();
        let deadline = sent + (shortest * 3 / 4).max(runtime.least_round);
        let renewer = &group[0].leased.renewer;
        let outcomes = answered_by(deadline, || renewer.renew_round(&requests));
        round.rounds += 1;
        for (index, renewal) in group.iter().enumerate() {
            // A missing outcome is a round that did not come back.
            let outcome = outcomes.get(index).copied().unwrap_or(RenewOutcome::Retry);
            apply(
                runtime,
                renewal,
                outcome,
                sent,
                now,
                &mut round,
                &mut explained,
            );
        }
    }
    let mut stats = runtime.watchdog.stats.lock();
    stats.rounds += round.rounds;
    stats.renewals += round.renewals;
}

fn apply(
    runtime: &LeaseRuntime,
    due: &DueRenewal,
    outcome: RenewOutcome,
    sent: Instant,
    now: Instant,
    round: &mut WatchdogStats,
    explained: &mut usize,
) {
    let request = RenewRequest {
        name: &due.leased.name,
        key: &due.leased.key,
        identity: &due.identity,
        fence: due.fence,
        lease: due.renewal.lease,
    };
    // Asked before the table is locked (it may take a round trip), for a
    // few losses per round: a flushed Redis must not cost the other
    // ownerships' renewals a round trip per lost one.
    let reason = match outcome {
        RenewOutcome::Lost if *explained < EXPLAINED_PER_ROUND => {
            *explained += 1;
            Some(due.leased.renewer.why_lost(&request))
        }
        RenewOutcome::Lost => Some(LostReason::NotHeld),
        RenewOutcome::Retry if now >= due.status.valid_until() => Some(LostReason::Unreachable),
        RenewOutcome::Retry | RenewOutcome::Renewed => None,
    };
    let mut lost = false;
    runtime
        .registry
        .update_renewal(due, |renewal| match (outcome, reason) {
            (RenewOutcome::Renewed, _) => {
                round.renewals += 1;
                let sent = earlier(sent, due.leased.renewer.clock_margin(renewal.lease));
                renewal.renewed(sent);
                due.status.lives_from(sent, renewal.lease);
            }
            (_, Some(reason)) => lost = lose(runtime, due, reason),
            (_, None) => {
                // Retry well before the lease ends: a tenth of it, or a
                // quarter of what is left of a hold that ends sooner (a
                // grant's, shorter than its lease).
                let failed = Instant::now();
                let left = due.status.valid_until().saturating_duration_since(failed);
                renewal.due = failed
                    + (renewal.lease / 10)
                        .clamp(Duration::from_millis(10), Duration::from_secs(1))
                        .min(left / 4);
            }
        });
    // Told with the table unlocked.
    let (name, kind) = (&*due.leased.name, due.leased.kind);
    match (outcome, reason) {
        (_, Some(reason)) if lost => {
            log::warn!("redbaton: {name:?} was lost: {reason}");
            runtime.observer.emit(|| Event::Lost { name, kind, reason });
        }
        (RenewOutcome::Retry, None) => {
            runtime
                .observer
                .emit(|| Event::RenewalFailed { name, kind });
        }
        _ => {}
    }
}

/// Marks `due` lost for `reason`; true the first time.
fn lose(runtime: &LeaseRuntime, due: &DueRenewal, reason: LostReason) -> bool {
    // Counted under the stats lock, taken before the guard can see the
    // loss: whoever sees `is_lost()` and then asks for the stats sees it
    // counted.
    let mut stats = runtime.watchdog.stats.lock();
    let first = due.status.mark_lost(reason);
    if first {
        stats.losses += 1;
    }
    first
}

/// Tells the loss signals of the watched fixed leases whose validity has
/// passed.
fn expire_due(runtime: &LeaseRuntime) {
    let now = Instant::now();
    let ended: Vec<(Arc<LeaseStatus>, Arc<str>, HoldKind)> = {
        let mut expiries = runtime.watchdog.expiries.lock();
        let mut ended = Vec::new();
        expiries.retain(|e| match e.status.upgrade() {
            Some(status) if status.valid_until() <= now => {
                ended.push((status, Arc::clone(&e.name), e.kind));
                false
            }
            Some(_) => true,
            None => false,
        });
        ended
    };
    for (status, name, kind) in ended {
        // A renewal or `extend` may have moved the end out meanwhile; the
        // next look finds it again if so.
        if status.valid_until() > Instant::now() {
            runtime.watchdog.expiries.lock().push(Expiry {
                status: Arc::downgrade(&status),
                name,
                kind,
            });
            continue;
        }
        if status.tell(LostReason::LeaseEnded) {
            runtime.observer.emit(|| Event::Lost {
                name: &name,
                kind,
                reason: LostReason::LeaseEnded,
            });
        }
    }
}

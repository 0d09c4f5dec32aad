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
//! then marks it lost.
//!
//! It also finishes what a caller could not: a release whose reply was lost,
//! or an acquisition whose reply was lost (which may have taken the lock for
//! nobody), is sent again until Redis answers or the lease it concerns has
//! ended anyway. Both are safe to send any number of times.
//!
//! The thread holds only a `Weak` to the client, and no lock of the client
//! while it talks to Redis.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use redis::{ServerErrorKind, Value};

use crate::client::Shared;
use crate::error::is_transient_reply;
use crate::keys::LockKeys;
use crate::ownership::DueRenewal;
use crate::scripts::{self, Call};

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
    rounds: AtomicU64,
    renewals: AtomicU64,
    losses: AtomicU64,
}

/// A release that must still reach Redis: its first send failed with the
/// outcome unknown, and until it lands the lock may be held by nobody's
/// guard.
#[derive(Debug)]
pub(crate) struct Cleanup {
    keys: Arc<LockKeys>,
    /// A script that is safe to send again (release.lua or
    /// release_request.lua).
    call: Call,
    /// When the lease it concerns has ended for sure: nothing left to do.
    give_up_at: Instant,
    next_try: Instant,
}

impl Cleanup {
    /// `call` frees what may be left of an ownership of `keys` whose lease
    /// is `lease` at the longest, counted from `sent`.
    pub(crate) fn new(keys: Arc<LockKeys>, call: Call, sent: Instant, lease: Duration) -> Self {
        Cleanup {
            keys,
            call,
            give_up_at: sent + lease,
            next_try: Instant::now(),
        }
    }
}

/// Clean-ups kept at most; a Redis down for long with many failing callers
/// must not grow memory without bound (the oldest ones, whose leases end
/// first, are dropped: those locks end with their lease).
const MAX_CLEANUPS: usize = 10_000;

/// Pause between tries of a clean-up while Redis does not answer.
const CLEANUP_RETRY: Duration = Duration::from_millis(50);

impl Watchdog {
    pub(crate) fn new() -> Self {
        let (wake, receiver) = crossbeam_channel::unbounded();
        Watchdog {
            wake,
            receiver: Mutex::new(Some(receiver)),
            cleanups: Mutex::new(Vec::new()),
            rounds: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            losses: AtomicU64::new(0),
        }
    }

    /// Tells the thread (starting it the first time) that a new ownership
    /// needs renewing, or a clean-up is waiting.
    pub(crate) fn wake(shared: &Arc<Shared>) {
        if let Some(receiver) = shared.watchdog.receiver.lock().take() {
            let weak = Arc::downgrade(shared);
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
        let _ = shared.watchdog.wake.send(());
    }

    /// Hands a release that could not be confirmed to the thread.
    pub(crate) fn clean_up(shared: &Arc<Shared>, cleanup: Cleanup) {
        {
            let mut cleanups = shared.watchdog.cleanups.lock();
            if cleanups.len() >= MAX_CLEANUPS {
                let dropped = cleanups.remove(0);
                log::warn!(
                    "redbaton: too many releases waiting for Redis; lock {:?} ends with its lease",
                    dropped.keys.name
                );
            }
            cleanups.push(cleanup);
        }
        Watchdog::wake(shared);
    }

    pub(crate) fn stats(&self) -> WatchdogStats {
        WatchdogStats {
            rounds: self.rounds.load(Ordering::Relaxed),
            renewals: self.renewals.load(Ordering::Relaxed),
            losses: self.losses.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count_loss(&self) {
        self.losses.fetch_add(1, Ordering::Relaxed);
    }

    fn next_cleanup(&self) -> Option<Instant> {
        self.cleanups.lock().iter().map(|c| c.next_try).min()
    }
}

/// The thread's body: ends when the client is gone.
fn run(shared: &Weak<Shared>, wake: &Receiver<()>) {
    // Whether the renewal script is known to be loaded on the server; the
    // first round loads it up front instead of failing once per lock.
    let mut script_loaded = false;
    loop {
        let next_due = match shared.upgrade() {
            Some(shared) => [
                shared.ownerships.next_renewal(),
                shared.watchdog.next_cleanup(),
            ]
            .into_iter()
            .flatten()
            .min(),
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
        let Some(shared) = shared.upgrade() else {
            return;
        };
        clean_up_due(&shared);
        renew_due(&shared, &mut script_loaded);
    }
}

/// Sends every clean-up whose time has come, once each.
fn clean_up_due(shared: &Shared) {
    let now = Instant::now();
    let due: Vec<Cleanup> = {
        let mut cleanups = shared.watchdog.cleanups.lock();
        let (due, later) = cleanups.drain(..).partition(|c| c.next_try <= now);
        *cleanups = later;
        due
    };
    for mut cleanup in due {
        match shared.run(&cleanup.keys.name, |c| cleanup.call.invoke::<i64>(c)) {
            Ok(_) => log::debug!(
                "redbaton: finished an unconfirmed release of {:?}",
                cleanup.keys.name
            ),
            Err(err) if err.is_transient() && Instant::now() < cleanup.give_up_at => {
                cleanup.next_try = Instant::now() + CLEANUP_RETRY;
                shared.watchdog.cleanups.lock().push(cleanup);
            }
            Err(err) if err.is_transient() => {}
            Err(err) => log::warn!(
                "redbaton: cannot finish the release of {:?}; it ends with its lease: {err}",
                cleanup.keys.name
            ),
        }
    }
}

/// One round: renews every ownership due soon, in one pipeline.
fn renew_due(shared: &Shared, script_loaded: &mut bool) {
    let now = Instant::now();
    let due = shared.ownerships.due_renewals(now);
    if due.is_empty() {
        return;
    }
    let calls: Vec<Call> = due
        .iter()
        .map(|d| scripts::lock::renew(&d.keys, &d.identity, d.fence, d.renewal.lease))
        .collect();
    let sent = Instant::now();
    let replies = send_round(shared, &calls, script_loaded);
    shared.watchdog.rounds.fetch_add(1, Ordering::Relaxed);

    for (index, renewal) in due.iter().enumerate() {
        let outcome = match &replies {
            Ok(values) => match values.get(index) {
                Some(Value::Int(1)) => Outcome::Renewed,
                // "Not now": try again, as when Redis is out of reach.
                Some(Value::ServerError(err)) if is_transient_reply(Some(err.code())) => {
                    Outcome::Unreachable
                }
                // 0: not this ownership any more. Any other error reply (say
                // WRONGTYPE: something else overwrote the key) means the same.
                Some(_) => Outcome::Lost("the lock is no longer held by this thread"),
                None => Outcome::Unreachable,
            },
            Err(()) => Outcome::Unreachable,
        };
        apply(shared, renewal, outcome, sent, now);
    }
}

enum Outcome {
    Renewed,
    Unreachable,
    Lost(&'static str),
}

fn apply(shared: &Shared, due: &DueRenewal, outcome: Outcome, sent: Instant, now: Instant) {
    shared
        .ownerships
        .update_renewal(due, |renewal| match outcome {
            Outcome::Renewed => {
                shared.watchdog.renewals.fetch_add(1, Ordering::Relaxed);
                renewal.renewed(sent);
            }
            Outcome::Unreachable if now < renewal.lease_ends => {
                // Retry well before the lease ends.
                renewal.due = now
                    + (renewal.lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
            }
            Outcome::Unreachable => lose(
                shared,
                due,
                "Redis stayed unreachable or busy until the lease ended",
            ),
            Outcome::Lost(why) => lose(shared, due, why),
        });
}

fn lose(shared: &Shared, due: &DueRenewal, why: &str) {
    if due.status.mark_lost() {
        shared.watchdog.count_loss();
        log::warn!("redbaton: lock {:?} was lost: {why}", due.keys.name);
    }
}

/// Sends the round on a command connection; (re)loads the script first when
/// it is not known to be loaded, and once more if the server forgot it
/// (restart, `SCRIPT FLUSH`). Renewal is idempotent, so sending the round
/// again (also on a fresh connection after a dropped one) is safe.
fn send_round(shared: &Shared, calls: &[Call], script_loaded: &mut bool) -> Result<Vec<Value>, ()> {
    let Some(first) = calls.first() else {
        return Ok(Vec::new());
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for call in calls {
        call.add_to(&mut pipe);
    }
    let forgot = |values: &[Value]| {
        values.iter().any(|value| {
            matches!(value, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript))
        })
    };
    shared
        .run("(watchdog renewal)", |c| {
            if !*script_loaded {
                first.load(c)?;
                *script_loaded = true;
            }
            let values: Vec<Value> = pipe.query(c)?;
            if !forgot(&values) {
                return Ok(values);
            }
            first.load(c)?;
            pipe.query(c)
        })
        .map_err(|err| log::warn!("redbaton: watchdog renewal failed: {err}"))
}

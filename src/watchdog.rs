//! The renewal thread: one per client, started when the first renewed lock
//! is taken, stopped when the client is dropped.
//!
//! It sleeps until the earliest renewal is due (or a new ownership arrives
//! over its channel), then renews in one pipeline every ownership due within
//! the next sixth of its lease, so locks taken at nearby moments share a
//! round trip. A renewal that finds the lock is no longer the ownership's
//! marks it lost; one that cannot reach Redis is retried until the lease
//! would have ended, then marks it lost.
//!
//! The thread holds only a `Weak` to the client. While it talks to Redis it
//! holds the ownership table locked, so that a guard withdrawing its
//! ownership before the release script waits for the round and no renewal
//! can follow a release.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use redis::{ServerErrorKind, Value};

use crate::client::{millis, Shared};
use crate::error::describe_io;
use crate::scripts;

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
    rounds: AtomicU64,
    renewals: AtomicU64,
    losses: AtomicU64,
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        let (wake, receiver) = crossbeam_channel::unbounded();
        Watchdog {
            wake,
            receiver: Mutex::new(Some(receiver)),
            rounds: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            losses: AtomicU64::new(0),
        }
    }

    /// Tells the thread (starting it the first time) that a new ownership
    /// needs renewing.
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
}

/// The thread's body: ends when the client is gone.
fn run(shared: &Weak<Shared>, wake: &Receiver<()>) {
    // Whether the renewal script is known to be loaded on the server; the
    // first round loads it up front instead of failing once per lock.
    let mut script_loaded = false;
    loop {
        let next_due = match shared.upgrade() {
            Some(shared) => next_due(&shared),
            None => return,
        };
        // With nothing to renew, sleep until a message: the channel
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
        renew_due(&shared, &mut script_loaded);
    }
}

fn next_due(shared: &Shared) -> Option<Instant> {
    shared
        .ownerships
        .lock()
        .values()
        .filter_map(|entry| entry.renewal.map(|r| r.due))
        .min()
}

/// One round: renews every ownership due soon, in one pipeline.
fn renew_due(shared: &Shared, script_loaded: &mut bool) {
    let mut entries = shared.ownerships.lock();
    let now = Instant::now();
    let mut due: Vec<_> = entries
        .iter()
        .filter_map(|(key, entry)| {
            let renewal = entry.renewal?;
            (renewal.due <= now + renewal.lease / 6).then(|| key.clone())
        })
        .collect();
    if due.is_empty() {
        return;
    }
    due.sort();

    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for key in &due {
        let entry = &entries[key];
        let lease = entry.renewal.map_or(Duration::ZERO, |r| r.lease);
        pipe.cmd("EVALSHA")
            .arg(scripts::RENEW.get_hash())
            .arg(1)
            .arg(&entry.keys.lock)
            .arg(&*entry.identity)
            .arg(entry.fence)
            .arg(millis(lease));
    }
    let sent = Instant::now();
    let replies = send_round(shared, &pipe, script_loaded);
    shared.watchdog.rounds.fetch_add(1, Ordering::Relaxed);

    for (index, key) in due.iter().enumerate() {
        let Some(entry) = entries.get_mut(key) else {
            continue;
        };
        let Some(renewal) = entry.renewal.as_mut() else {
            continue;
        };
        let outcome = match &replies {
            Ok(values) => match values.get(index) {
                Some(Value::Int(1)) => Outcome::Renewed,
                // 0: not this ownership any more. An error reply (say
                // WRONGTYPE: something else overwrote the key) means the same.
                Some(_) => Outcome::Lost("the lock is no longer held by this thread"),
                None => Outcome::Unreachable,
            },
            Err(_) => Outcome::Unreachable,
        };
        match outcome {
            Outcome::Renewed => {
                shared.watchdog.renewals.fetch_add(1, Ordering::Relaxed);
                renewal.lease_ends = sent + renewal.lease;
                renewal.due = sent + renewal.lease / 3;
            }
            Outcome::Unreachable if now < renewal.lease_ends => {
                // Retry well before the lease ends.
                renewal.due = now
                    + (renewal.lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
            }
            Outcome::Unreachable => lose(
                shared,
                entry,
                "Redis stayed unreachable until the lease ended",
            ),
            Outcome::Lost(why) => lose(shared, entry, why),
        }
    }
    entries.retain(|_, entry| !entry.status.is_lost());
}

enum Outcome {
    Renewed,
    Unreachable,
    Lost(&'static str),
}

fn lose(shared: &Shared, entry: &crate::ownership::Entry, why: &str) {
    if entry.status.mark_lost() {
        shared.watchdog.count_loss();
        log::warn!("redbaton: lock {:?} was lost: {why}", entry.keys.name);
    }
}

/// Sends the round on a command connection; (re)loads the script first when
/// it is not known to be loaded, and once more if the server forgot it
/// (restart, `SCRIPT FLUSH`). Renewal is idempotent, so sending the round
/// again is safe.
fn send_round(
    shared: &Shared,
    pipe: &redis::Pipeline,
    script_loaded: &mut bool,
) -> Result<Vec<Value>, ()> {
    let mut conn = shared.commands.get(shared.io_timeout).map_err(|err| {
        log::warn!("redbaton: watchdog could not get a connection: {err}");
    })?;
    let load = |conn: &mut crate::pool::PooledConn| {
        conn.run(|c| scripts::RENEW.prepare_invoke().load(c))
            .map(drop)
            .map_err(|err| {
                log::warn!(
                    "redbaton: watchdog could not load its script: {}",
                    describe_io(&err)
                );
            })
    };
    if !*script_loaded {
        load(&mut conn)?;
        *script_loaded = true;
    }
    for _ in 0..2 {
        let values: Vec<Value> = conn.run(|c| pipe.query(c)).map_err(|err| {
            log::warn!("redbaton: watchdog renewal failed: {}", describe_io(&err));
        })?;
        let forgot = values.iter().any(|value| {
            matches!(value, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript))
        });
        if !forgot {
            return Ok(values);
        }
        conn.run(|c| scripts::RENEW.prepare_invoke().load(c))
            .map_err(|err| {
                log::warn!(
                    "redbaton: watchdog could not load its script: {}",
                    describe_io(&err)
                );
            })?;
    }
    Err(())
}

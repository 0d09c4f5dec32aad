//! Leases: how an ownership stays alive (renewed by the watchdog, or
//! fixed), the table of ownerships this client holds, and the thread that
//! renews them and finishes releases Redis could not be told about.
//!
//! Nothing here knows which Redis protocol a lock speaks: the watchdog
//! renews through [`RenewLeases`], implemented by each synchronizer's raw
//! protocol, and finishes releases through the closures in [`Cleanup`].

pub(crate) mod confirm;
mod registry;
mod watchdog;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redis::{ServerErrorKind, Value};

use crate::backend::{is_transient_reply, Backend};
use crate::client_name::NameRecord;
use crate::observe::{HoldKind, LostReason, Observer};

pub(crate) use registry::{DueRenewal, Entered, Held, Ownerships};
pub use watchdog::WatchdogStats;
pub(crate) use watchdog::{Cleanup, Watchdog};

/// How an acquisition keeps its lock alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// The watchdog renews the lease while a guard lives.
    Renewed(Duration),
    /// The lock ends at its lease, guard or not.
    Fixed(Duration),
}

impl LeaseMode {
    pub(crate) fn lease(self) -> Duration {
        match self {
            LeaseMode::Renewed(lease) | LeaseMode::Fixed(lease) => lease,
        }
    }
}

/// What the guards of one ownership can see without asking Redis.
#[derive(Debug)]
pub(crate) struct LeaseStatus {
    /// Set when the ownership is known to be gone (a renewal, `extend` or
    /// release found it so, or the watchdog gave up on it).
    lost: AtomicBool,
    /// When the ownership ends at the latest unless renewed, by this
    /// process's clock: measured from before the request that set the
    /// lease was sent, and moved in by the deployment's clock margin, so
    /// never later than the lease's end in Redis. Only moves out.
    valid_until: Mutex<Instant>,
    /// The loss signal: empty (no allocation, no timer) until a guard's
    /// `lost()` asks for it.
    signal: Mutex<Signal>,
    /// Set (under `signal`'s lock) when a guard first asks for the loss
    /// signal, so that a release of a hold nobody watched takes no lock.
    /// The guards of a hold (and so `lost()` and their release) are on one
    /// thread, or a permit's owner: a release never races the first ask.
    watched: AtomicBool,
}

/// The receivers handed out by `lost()`, and whether they were told.
#[derive(Debug, Default)]
struct Signal {
    /// Why the ownership was lost, once told (each receiver hears once).
    reason: Option<LostReason>,
    /// One per `lost()` call (bounded(1)); dropped once sent, or when the
    /// last guard releases, which disconnects its receiver.
    senders: Vec<Sender<LostReason>>,
    /// The last guard released: nothing is told any more.
    closed: bool,
}

impl Signal {
    /// Tells the receivers `reason`, once; nothing once the guards
    /// released.
    fn tell(&mut self, reason: LostReason) {
        if self.reason.is_some() || self.closed {
            return;
        }
        self.reason = Some(reason);
        for sender in self.senders.drain(..) {
            let _ = sender.try_send(reason);
        }
    }
}

impl LeaseStatus {
    /// A live ownership, valid until `valid_until` unless renewed.
    pub(crate) fn new(valid_until: Instant) -> Self {
        LeaseStatus {
            lost: AtomicBool::new(false),
            valid_until: Mutex::new(valid_until),
            signal: Mutex::new(Signal::default()),
            watched: AtomicBool::new(false),
        }
    }

    /// Whether the ownership is known to be gone, or its validity has
    /// passed without a confirmed renewal.
    pub(crate) fn is_lost(&self) -> bool {
        self.is_marked_lost() || Instant::now() >= self.valid_until()
    }

    /// Whether the ownership was found gone (not merely out of time: a
    /// renewal may still be on its way, and a release is owner-checked).
    pub(crate) fn is_marked_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// When the ownership ends at the latest unless renewed.
    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    /// Records that the ownership is gone, for `reason`, and tells the
    /// loss signal's receivers; true the first time.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        if self.lost.swap(true, Ordering::AcqRel) {
            return false;
        }
        let mut signal = self.signal.lock();
        // Told already (the watchdog tells a fixed lease's end without
        // marking it, so that its release is still sent): that loss was
        // announced then, and this is not a new one.
        if signal.reason.is_some() {
            return false;
        }
        signal.tell(reason);
        true
    }

    /// A receiver of the loss signal: it gets the reason once, when the
    /// ownership is found lost (at once if it already was), and is
    /// disconnected without a message when the last guard releases.
    pub(crate) fn subscribe(&self) -> Receiver<LostReason> {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        let mut signal = self.signal.lock();
        self.watched.store(true, Ordering::Release);
        match signal.reason {
            // Room for one: never blocks.
            Some(reason) => drop(sender.try_send(reason)),
            None if signal.closed => {}
            None => signal.senders.push(sender),
        }
        receiver
    }

    /// Tells the receivers of the loss signal why the ownership is lost,
    /// unless they were told already or the guards released; true when
    /// this call told them.
    pub(crate) fn tell(&self, reason: LostReason) -> bool {
        let mut signal = self.signal.lock();
        if signal.reason.is_some() || signal.closed {
            return false;
        }
        signal.tell(reason);
        true
    }

    /// The last guard released: the receivers are disconnected, never told
    /// (a release is not a loss, whatever it finds).
    pub(crate) fn close_signal(&self) {
        if !self.watched.load(Ordering::Acquire) {
            return;
        }
        let mut signal = self.signal.lock();
        signal.closed = true;
        signal.senders.clear();
    }

    /// The last guard released, and the ownership passed in memory to
    /// another thread of this client: the releaser's receivers are
    /// disconnected, untold, and the next holder's are made afresh.
    pub(crate) fn hand_over_signal(&self) {
        if !self.watched.load(Ordering::Acquire) {
            return;
        }
        let mut signal = self.signal.lock();
        signal.closed = false;
        signal.senders.clear();
    }

    /// Whether the loss signal was told a reason (told once, whether or
    /// not anybody listened): the hold's `Lost` event was sent.
    pub(crate) fn was_told_lost(&self) -> bool {
        self.signal.lock().reason.is_some()
    }

    /// Whether receivers wait to be told.
    pub(crate) fn is_watched(&self) -> bool {
        !self.signal.lock().senders.is_empty()
    }

    /// A request sent at `sent` (already moved in by the clock margin)
    /// made the ownership live at least `lease` more: its end moves out,
    /// never in.
    pub(crate) fn lives_from(&self, sent: Instant, lease: Duration) {
        let mut until = self.valid_until.lock();
        *until = (*until).max(sent + lease);
    }
}

/// Who asks for an ownership, and how it is to be kept alive: what a
/// waiter carries in the local queue, so that a releasing thread can hand
/// it the lock.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) identity: Arc<str>,
    pub(crate) mode: LeaseMode,
    /// Whether the waiter takes the releaser's ownership as it is, passed
    /// in memory ([`Grant::Passed`]), when its lease mode is the same: a
    /// plain lock's waiter does; a multi-lock's, which goes on to take
    /// other names in Redis with its own identity, gets a fresh ownership.
    pub(crate) takes_passed: bool,
}

/// An ownership handed over by a releasing thread of this client.
#[derive(Debug, Clone)]
pub(crate) enum Grant {
    /// The hand-off script gave the waiter a fresh ownership in Redis.
    Fresh {
        /// The fencing token of the new ownership.
        fence: u64,
        /// When the hand-off was sent: where the new lease starts at the
        /// latest.
        sent: Instant,
        /// A fair lock's: the waiter first in the queue behind the new
        /// holder (whom its release will likely wake).
        next_in_line: Option<String>,
    },
    /// The releaser's ownership itself, passed in memory: nothing was sent
    /// to Redis.
    Passed(Passed),
}

/// An ownership passed in memory from one thread of this client to
/// another: what the new holder's guard needs (the registry already files
/// the ownership under the new holder).
#[derive(Debug, Clone)]
pub(crate) struct Passed {
    /// The identity the ownership is held as in Redis (the thread that
    /// took it there).
    pub(crate) identity: Arc<str>,
    /// Its fencing token in Redis.
    pub(crate) fence: u64,
    /// The new holder's token: one more than the releaser's, within the
    /// tokens Redis set aside above `fence` (see `lib/next_fence.lua`).
    pub(crate) token: u64,
    pub(crate) mode: LeaseMode,
    pub(crate) status: Arc<LeaseStatus>,
    /// A fair lock's: the run the ownership goes on with.
    pub(crate) run: FairRun,
}

impl PartialEq for Passed {
    fn eq(&self, other: &Self) -> bool {
        (&self.identity, self.fence, self.token, self.mode, &self.run)
            == (
                &other.identity,
                other.fence,
                other.token,
                other.mode,
                &other.run,
            )
            && Arc::ptr_eq(&self.status, &other.status)
    }
}

/// A fair lock's run of in-memory hand-offs: the threads of this client
/// first in the queue behind the ownership's acquisition, which it passes
/// to in their order, and those it was passed to already. Empty for every
/// other ownership.
///
/// Every holder of the run shares its places: a pass copies no waiter's
/// name, whatever the length of the line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FairRun {
    /// The places the run serves, with their arrivals (server µs), in
    /// order: a grantee's own place first when the run began with a grant,
    /// then the line of waiters.
    places: Arc<[(String, u64)]>,
    /// How many of `places` are served: the ownership was passed to them
    /// (or granted), and their places stay in the queue until the run's
    /// last release drops them.
    served: usize,
    /// The waiter behind the line, if any: whom the run's last release
    /// will likely wake.
    after: Option<Arc<str>>,
}

impl FairRun {
    /// A run along `line` (waiters with their arrivals, in queue order),
    /// with `served` served already (none, or a grantee's own place), and
    /// `after` behind the line.
    pub(crate) fn new(
        served: Vec<(String, u64)>,
        line: Vec<(String, u64)>,
        after: Option<String>,
    ) -> Self {
        let done = served.len();
        let mut places = served;
        places.extend(line);
        FairRun {
            places: places.into(),
            served: done,
            after: after.map(Arc::from),
        }
    }

    /// The waiters still ahead, in queue order.
    pub(crate) fn ahead(&self) -> &[(String, u64)] {
        &self.places[self.served..]
    }

    /// The places served so far, which the run's last release drops.
    pub(crate) fn served(&self) -> &[(String, u64)] {
        &self.places[..self.served]
    }

    /// The waiter a release will likely wake: the next ahead, else the
    /// one after the line.
    pub(crate) fn next_in_line(&self) -> Option<&str> {
        self.ahead()
            .first()
            .map(|(waiter, _)| waiter.as_str())
            .or(self.after.as_deref())
    }

    /// The run once its next waiter is served.
    pub(crate) fn advanced(&self) -> FairRun {
        FairRun {
            places: Arc::clone(&self.places),
            served: (self.served + 1).min(self.places.len()),
            after: self.after.clone(),
        }
    }
}

/// What an ownership's lease lives on, and how the watchdog renews it:
/// every synchronizer that leases something (a lock, a read hold, a
/// semaphore's permits) describes its ownerships this way, so that one
/// watchdog renews them all, each through its own protocol.
#[derive(Debug, Clone)]
pub(crate) struct Leased {
    /// The object's name, for messages.
    pub(crate) name: Arc<str>,
    /// What is held, for events.
    pub(crate) kind: HoldKind,
    /// The key the lease lives on (and that routes the renewal).
    pub(crate) key: Arc<str>,
    /// The protocol that renews it.
    pub(crate) renewer: Arc<dyn RenewLeases>,
}

/// One ownership to renew.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenewRequest<'a> {
    /// The object's name, for messages.
    pub(crate) name: &'a str,
    /// The key the lease lives on.
    pub(crate) key: &'a str,
    pub(crate) identity: &'a str,
    pub(crate) fence: u64,
    pub(crate) lease: Duration,
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewOutcome {
    /// The ownership lives at least its lease more.
    Renewed,
    /// Redis could not be reached or said "not now": try again.
    Retry,
    /// The lock is gone or someone else's.
    Lost,
}

/// How the watchdog renews ownerships: many in one round where the
/// protocol allows (one pipeline on one server).
pub(crate) trait RenewLeases: Send + Sync + fmt::Debug {
    /// Renews each request; one outcome per request, in order.
    fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome>;

    /// How much earlier than `sent + lease` a lease written at `sent` may
    /// end in Redis, for clocks that drift: the local lease end (what
    /// `is_lost()` and the watchdog count on) is moved in by this much.
    /// Nothing for one deployment, whose single clock is the lease's.
    fn clock_margin(&self, lease: Duration) -> Duration {
        let _ = lease;
        Duration::ZERO
    }

    /// Why an ownership whose renewal came back `Lost` is gone, if the
    /// protocol can tell with one more look (asked on the watchdog thread,
    /// once per loss).
    fn why_lost(&self, request: &RenewRequest<'_>) -> LostReason {
        let _ = request;
        LostReason::NotHeld
    }
}

/// Renews `requests` in one pipeline per server: groups them by the server
/// their keys live on (one group, except on a cluster) and has
/// `renew_shard` renew each group, in order. Renewal is idempotent, so a
/// protocol may send a group again (after `NOSCRIPT`, a dropped
/// connection, a redirection).
pub(crate) fn renew_by_shard<'a>(
    backend: &Backend,
    requests: &'a [RenewRequest<'a>],
    mut renew_shard: impl FnMut(&[&'a RenewRequest<'a>]) -> Vec<RenewOutcome>,
) -> Vec<RenewOutcome> {
    let keys: Vec<&str> = requests.iter().map(|r| r.key).collect();
    let mut outcomes = vec![RenewOutcome::Retry; requests.len()];
    for shard in backend.shards(&keys) {
        let batch: Vec<&RenewRequest<'_>> = shard.iter().map(|&i| &requests[i]).collect();
        for (i, outcome) in shard.iter().zip(renew_shard(&batch)) {
            outcomes[*i] = outcome;
        }
    }
    outcomes
}

/// What one renewal script's reply in a pipeline says: 1 renewed; "not
/// now" (`BUSY`, ...) retry; 0 (not this ownership any more) or any other
/// error reply (say WRONGTYPE: something else overwrote the key) lost.
pub(crate) fn renew_outcome(value: &Value) -> RenewOutcome {
    match value {
        Value::Int(1) => RenewOutcome::Renewed,
        Value::ServerError(err) if is_transient_reply(Some(err.code())) => RenewOutcome::Retry,
        _ => RenewOutcome::Lost,
    }
}

/// A cluster's `MOVED` or `ASK` inside a pipeline: that renewal is to be
/// sent again alone, following the redirection.
pub(crate) fn is_redirection(value: &Value) -> bool {
    matches!(value, Value::ServerError(err) if matches!(err.kind(), Some(ServerErrorKind::Moved | ServerErrorKind::Ask)))
}

/// `sent`, moved back by `margin` (where the clock allows).
pub(crate) fn earlier(sent: Instant, margin: Duration) -> Instant {
    sent.checked_sub(margin).unwrap_or(sent)
}

/// The least time a renewal round is given to be answered (beyond a wait
/// for replicas): a few round trips of a loaded machine.
const LEAST_ROUND: Duration = Duration::from_millis(20);

/// What the watchdog thread works on: the table of ownerships (each with
/// the way to renew it) and its own state. The thread holds a `Weak` to
/// this only, not to the client.
#[derive(Debug)]
pub(crate) struct LeaseRuntime {
    pub(crate) registry: Ownerships,
    pub(crate) watchdog: Watchdog,
    /// The client's name record, kept alive by the watchdog's rounds too
    /// (a renewed lock may be held long after the client's last call).
    pub(crate) name: Option<NameRecord>,
    /// Told of renewals that failed, losses and background releases.
    pub(crate) observer: Observer,
    /// The least time a renewal round is given to be answered, however
    /// soon a hold it renews ends: a round that waits for replicas (its
    /// `WAIT`) is answered only after their timeout.
    pub(crate) least_round: Duration,
}

impl LeaseRuntime {
    /// `replicas_wait`: how long a write waits for replicas
    /// (`replica_acks`' timeout), if it does.
    pub(crate) fn new(
        name: Option<NameRecord>,
        observer: Observer,
        replicas_wait: Option<Duration>,
    ) -> Self {
        LeaseRuntime {
            registry: Ownerships::default(),
            watchdog: Watchdog::new(),
            name,
            observer,
            least_round: replicas_wait.unwrap_or_default() + LEAST_ROUND,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fair_run_serves_its_line_in_order_and_its_passes_share_the_places() {
        let place = |name: &str, arrival| (name.to_owned(), arrival);
        let run = FairRun::new(
            vec![place("c:1", 10)],
            vec![place("c:2", 20), place("c:3", 30)],
            Some("d:1".to_owned()),
        );
        assert_eq!(run.served(), &[place("c:1", 10)]);
        assert_eq!(run.next_in_line(), Some("c:2"));
        let once = run.advanced();
        assert_eq!(once.served(), &[place("c:1", 10), place("c:2", 20)]);
        assert_eq!(once.ahead(), &[place("c:3", 30)]);
        let done = once.advanced();
        assert!(done.ahead().is_empty());
        assert_eq!(
            done.next_in_line(),
            Some("d:1"),
            "then the one behind the line"
        );
        assert_eq!(done.advanced(), done, "nobody left to serve");
        assert!(
            Arc::ptr_eq(&run.places, &done.places),
            "a pass copies no waiter's name"
        );
    }
}

//! Threads of one process waiting for the same key: a FIFO queue per
//! (client, baton key), the parker role, and local hand-offs.
//!
//! Generic in what a waiter carries (`C`, its claim: who it is and what it
//! asks for) and in what a hand-off gives it (`G`, the grant), so that every
//! synchronizer queues its waiters here.
//!
//! One waiter at a time is the *parker*: it waits in Redis (`BLPOP`) for
//! the whole queue. The others sleep on their own condition variable. A
//! thread of this process that releases the lock while waiters are queued
//! here hands it to a waiter that is not parked in Redis, the oldest as a
//! rule (see below): it *reserves* that waiter, passes the lock in memory
//! or runs the hand-off script, and then either grants the waiter the lock
//! (it owns it without a round trip of its own) or tells it to look again.
//! A reserved waiter does not leave, even at its deadline, until the
//! reservation is settled, so the lock is never handed to a thread that
//! has given up. After a run of hand-offs the holder releases globally
//! instead (baton in Redis), so that other processes get their turn.
//!
//! A waiter about to sleep first stays awake a little, yielding (one per
//! queue at a time: the *spinner*), and a release hands the lock to that
//! waiter before an older, sleeping one, unless the last hand-off to the
//! oldest waiter was [`FAIR_INTERVAL`] ago or more: waking a sleeping
//! thread costs more than a short hold (on a small machine, most of a
//! local hand-off's time), and the interval bounds how long the oldest
//! waiter is passed over, as `parking_lot`'s eventual fairness does.
//! Where nothing is handed over (a limit of 0), waiters sleep at once.
//!
//! A fair lock's waiter is alone in its queue (keyed by its own list), so
//! it is always the parker. A releasing thread whose next in line it is
//! reserves it between two of its attempts (`reserve_parker`), and ends
//! its park once the hand-off is settled; a reserved parker makes no
//! attempt and does not leave until then.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::park::UnconfirmedRun;

/// How long a waiter stays awake before it sleeps, where a hand-off may
/// come while it does: about what waking a sleeping thread takes on a
/// small, shared machine, so that a run of short holds passes from one
/// running thread to the next. A waiter behind a long hold spends it once
/// per wait, yielding.
const SPIN: Duration = Duration::from_micros(50);

/// How long a release may hand the lock to a spinning waiter before the
/// oldest, sleeping one, from the last hand-off to the oldest: the bound on
/// how long the oldest waiter is passed over.
const FAIR_INTERVAL: Duration = Duration::from_micros(500);

/// How a waiter is woken: its condition variable, and a flag for while it
/// spins, set whenever its status changes (always with the queue locked).
#[derive(Debug, Default)]
struct Wake {
    condvar: Condvar,
    poked: AtomicBool,
}

impl Wake {
    /// Tells the waiter its status changed, whether it sleeps or spins.
    fn poke(&self) {
        self.poked.store(true, Ordering::Release);
        self.condvar.notify_one();
    }

    /// Stays awake until poked or `until`; called with the queue unlocked.
    /// It yields rather than spins in place: on a machine with fewer cores
    /// than threads, the thread a hand-off wakes, or the holder, may need
    /// this core (measured on 2 cores, 16 threads: spinning in place for
    /// 100 µs took the rate of hand-offs below sleeping at once).
    fn spin(&self, until: Instant) {
        while !self.poked.load(Ordering::Acquire) && Instant::now() < until {
            std::thread::yield_now();
        }
    }
}

/// What a waiting thread should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn<G> {
    /// Wait in Redis for the queue (this thread is the parker now).
    Park,
    /// The lock was handed to this thread.
    Granted(G),
    /// A hand-off to this thread failed and may or may not have happened:
    /// make one attempt, then wait again.
    Retry,
    /// The deadline passed.
    TimedOut,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status<G> {
    /// In `next_turn`, asleep or about to sleep: the only status a
    /// hand-off may pick.
    Waiting,
    /// Waiting in Redis for the queue.
    Parker,
    /// Picked for a hand-off that is under way.
    Reserved,
    Granted(G),
    /// A hand-off failed: the thread should look at the lock itself.
    Retry,
    /// Out of `next_turn`, making that attempt: not to be picked, for the
    /// attempt may win the lock and the thread leave.
    Attempting,
    /// The parker, making an attempt: not to be picked, as `Attempting`.
    ParkerAttempting,
    /// The parker, picked for a hand-off under way ([`LocalQueues::reserve_parker`]):
    /// it makes no attempt and does not leave until the hand-off is
    /// settled.
    ParkerReserved,
    /// The parker, leaving without the lock: not to be picked.
    Leaving,
}

impl<G> Status<G> {
    /// Whether this slot's thread waits in Redis for the queue (or is
    /// between two of its parks).
    fn is_parker(&self) -> bool {
        matches!(
            self,
            Status::Parker | Status::ParkerAttempting | Status::ParkerReserved
        )
    }
}

#[derive(Debug)]
struct Slot<C, G> {
    id: u64,
    claim: C,
    status: Status<G>,
    wake: Arc<Wake>,
    /// The parker's: the list it parks on (or is about to), for a hand-off
    /// to end that park.
    parks_on: Option<String>,
}

#[derive(Debug)]
struct QueueState<C, G> {
    /// In arrival order; the parker and reserved waiters included.
    slots: VecDeque<Slot<C, G>>,
    next_id: u64,
    /// Local hand-offs since the lock was last released globally.
    handoffs_in_a_row: u32,
    /// When the first of them was made.
    run_started: Option<Instant>,
    /// The waiter spinning before it sleeps, if one is.
    spinner: Option<u64>,
    /// When a hand-off last went to the oldest waiter.
    last_fair: Option<Instant>,
    /// The run of writes the replicas did not confirm that this queue's
    /// parkers met: a new parker goes on with it.
    unconfirmed: Option<UnconfirmedRun>,
}

impl<C, G> Default for QueueState<C, G> {
    fn default() -> Self {
        QueueState {
            slots: VecDeque::new(),
            next_id: 0,
            handoffs_in_a_row: 0,
            run_started: None,
            spinner: None,
            last_fair: None,
            unconfirmed: None,
        }
    }
}

impl<C, G> QueueState<C, G> {
    fn slot_mut(&mut self, id: u64) -> Option<&mut Slot<C, G>> {
        self.slots.iter_mut().find(|slot| slot.id == id)
    }

    /// Takes a waiter out of the queue, waking a new parker if needed.
    fn remove(&mut self, id: u64) {
        if let Some(index) = self.slots.iter().position(|s| s.id == id) {
            self.slots.remove(index);
            self.ensure_parker();
        }
    }

    /// With nobody parked in Redis for the queue, wakes the oldest plain
    /// waiter to take over. Called whenever a waiter leaves or is reserved:
    /// the one just told to take over may be reserved before it wakes.
    fn ensure_parker(&self) {
        if self.slots.iter().any(|s| s.status.is_parker()) {
            return;
        }
        if let Some(slot) = self
            .slots
            .iter()
            .find(|s| matches!(s.status, Status::Waiting))
        {
            slot.wake.poke();
        }
    }

    /// The waiter a release hands the lock to: the spinning one, if it is
    /// waiting and the oldest waiter was last served less than
    /// [`FAIR_INTERVAL`] ago; else the oldest waiter not parked in Redis.
    fn pick(&mut self) -> Option<&mut Slot<C, G>> {
        let now = Instant::now();
        let oldest = self
            .slots
            .iter()
            .position(|s| matches!(s.status, Status::Waiting))?;
        let passed_over = self
            .last_fair
            .is_some_and(|served| now.duration_since(served) < FAIR_INTERVAL);
        let spinning = self.spinner.and_then(|id| {
            self.slots
                .iter()
                .position(|s| s.id == id && matches!(s.status, Status::Waiting))
        });
        let index = match spinning {
            Some(index) if index != oldest && passed_over => index,
            _ => {
                self.last_fair = Some(now);
                oldest
            }
        };
        self.slots.get_mut(index)
    }
}

#[derive(Debug)]
struct Queue<C, G> {
    state: Mutex<QueueState<C, G>>,
}

impl<C, G> Default for Queue<C, G> {
    fn default() -> Self {
        Queue {
            state: Mutex::new(QueueState::default()),
        }
    }
}

/// The queues of one client, by baton key.
#[derive(Debug)]
pub(crate) struct LocalQueues<C, G> {
    queues: Mutex<HashMap<String, Arc<Queue<C, G>>>>,
    handoff_limit: u32,
    run_limit: Duration,
}

impl<C: Clone, G: Clone> LocalQueues<C, G> {
    /// Queues whose locks are handed on locally at most `handoff_limit`
    /// times in a row (0: never), and for at most `run_limit` from the
    /// first.
    pub(crate) fn new(handoff_limit: u32, run_limit: Duration) -> Self {
        LocalQueues {
            queues: Mutex::new(HashMap::new()),
            handoff_limit,
            run_limit,
        }
    }

    /// Whether threads of this client are waiting for `lock_key`: a newcomer
    /// then queues behind them instead of trying first (no barging).
    pub(crate) fn has_waiters(&self, lock_key: &str) -> bool {
        self.queues.lock().contains_key(lock_key)
    }

    /// Queues the calling thread, which carries `claim`.
    pub(crate) fn join(&self, lock_key: &str, claim: C) -> Member<'_, C, G> {
        // Joined while the map is locked, so that a member leaving at the
        // same moment cannot remove the queue this one is joining.
        let mut queues = self.queues.lock();
        let queue = Arc::clone(queues.entry(lock_key.to_owned()).or_default());
        let mut state = queue.state.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.slots.push_back(Slot {
            id,
            claim,
            status: Status::Waiting,
            wake: Arc::default(),
            parks_on: None,
        });
        drop(state);
        drop(queues);
        Member {
            queues: self,
            lock_key: lock_key.to_owned(),
            queue,
            id,
        }
    }

    /// For a thread releasing `lock_key` for good: reserves a waiter not
    /// parked in Redis (the spinner or the oldest, see the module's docs),
    /// unless there is none or the run of local hand-offs is at its limit.
    pub(crate) fn reserve(&self, lock_key: &str) -> Option<Reservation<C, G>> {
        let queue = Arc::clone(self.queues.lock().get(lock_key)?);
        let mut state = queue.state.lock();
        let run_over = state
            .run_started
            .is_some_and(|started| started.elapsed() >= self.run_limit);
        if state.handoffs_in_a_row >= self.handoff_limit || run_over {
            return None;
        }
        let slot = state.pick()?;
        slot.status = Status::Reserved;
        let (id, claim) = (slot.id, slot.claim.clone());
        state.ensure_parker();
        drop(state);
        Some(Reservation {
            queue,
            id,
            claim,
            parks_on: None,
            settled: false,
        })
    }

    /// For a thread releasing `lock_key`'s object for good: reserves the
    /// parker of the key's queue, unless it is making an attempt or
    /// leaving. For a waiter that is alone in its queue (a fair lock's,
    /// on its own list), which a release hands the lock to only when
    /// Redis says it is its turn; so no bound on runs applies. The parker
    /// makes no attempt while reserved: the grant never reaches it through
    /// an attempt of its own.
    pub(crate) fn reserve_parker(&self, lock_key: &str) -> Option<Reservation<C, G>> {
        let queue = Arc::clone(self.queues.lock().get(lock_key)?);
        let mut state = queue.state.lock();
        let slot = state
            .slots
            .iter_mut()
            .find(|s| matches!(s.status, Status::Parker))?;
        slot.status = Status::ParkerReserved;
        let reservation = Reservation {
            queue: Arc::clone(&queue),
            id: slot.id,
            claim: slot.claim.clone(),
            parks_on: slot.parks_on.clone(),
            settled: false,
        };
        drop(state);
        Some(reservation)
    }

    /// The lock was released in Redis (baton pushed): a new run of local
    /// hand-offs may start.
    pub(crate) fn released_globally(&self, lock_key: &str) {
        let queue = self.queues.lock().get(lock_key).cloned();
        if let Some(queue) = queue {
            let mut state = queue.state.lock();
            state.handoffs_in_a_row = 0;
            state.run_started = None;
        }
    }
}

/// A thread's place in the queue of one lock name; leaving (drop) hands the
/// parker role on.
#[derive(Debug)]
pub(crate) struct Member<'a, C, G> {
    queues: &'a LocalQueues<C, G>,
    lock_key: String,
    queue: Arc<Queue<C, G>>,
    id: u64,
}

impl<C, G: Clone> Member<'_, C, G> {
    /// The queue's run of unconfirmed writes, if one is under way.
    pub(crate) fn unconfirmed_run(&self) -> Option<UnconfirmedRun> {
        self.queue.state.lock().unconfirmed.clone()
    }

    /// Records (or, `None`, ends) the queue's run of unconfirmed writes.
    pub(crate) fn set_unconfirmed_run(&self, run: Option<UnconfirmedRun>) {
        self.queue.state.lock().unconfirmed = run;
    }

    /// Ends the queue's run of unconfirmed writes (someone acquired).
    pub(crate) fn end_unconfirmed_run(&self) {
        self.queue.state.lock().unconfirmed = None;
    }

    /// Sleeps until this thread has something to do, or `deadline` passes.
    ///
    /// Without a deadline, and while reserved for a hand-off, the sleep has
    /// no timeout: a parker's own waits are bounded (its `BLPOP` by the park
    /// time, its socket by the I/O timeout) and its leaving wakes the next;
    /// a reservation is settled when the releaser's script returns, within
    /// its I/O timeouts, or when the reservation is dropped.
    pub(crate) fn next_turn(&self, deadline: Option<Instant>) -> Turn<G> {
        let mut state = self.queue.state.lock();
        let mut may_spin = true;
        loop {
            let has_parker = state.slots.iter().any(|s| s.status.is_parker());
            // Only where a release may hand over: elsewhere nothing comes
            // to a waiter while it spins but a new parker's turn.
            let spin = may_spin && self.queues.handoff_limit > 0 && state.spinner.is_none();
            let Some(slot) = state.slot_mut(self.id) else {
                return Turn::TimedOut;
            };
            let wake = Arc::clone(&slot.wake);
            match slot.status {
                Status::Granted(ref grant) => return Turn::Granted(grant.clone()),
                Status::Parker => return Turn::Park,
                Status::Retry => {
                    slot.status = Status::Attempting;
                    return Turn::Retry;
                }
                Status::Attempting => slot.status = Status::Waiting,
                Status::Waiting if !has_parker => {
                    slot.status = Status::Parker;
                    return Turn::Park;
                }
                Status::Reserved => wake.condvar.wait(&mut state),
                // The parker's own statuses: it is in its park loop, which
                // reads them through `parker_turn`, `parker_parks` and
                // `parker_leaves`.
                Status::ParkerAttempting | Status::ParkerReserved | Status::Leaving => {
                    return Turn::Park
                }
                Status::Waiting if spin => {
                    // Once a call, one waiter of the queue at a time: a
                    // hand-off that comes while it spins wakes nobody.
                    may_spin = false;
                    state.spinner = Some(self.id);
                    wake.poked.store(false, Ordering::Relaxed);
                    let until = Instant::now() + SPIN;
                    let until = deadline.map_or(until, |deadline| deadline.min(until));
                    MutexGuard::unlocked(&mut state, || wake.spin(until));
                    // Still this waiter's: nobody else sets it while set.
                    state.spinner = None;
                }
                Status::Waiting => {
                    let Some(deadline) = deadline else {
                        wake.condvar.wait(&mut state);
                        continue;
                    };
                    let timed_out = wake.condvar.wait_until(&mut state, deadline).timed_out();
                    let still_waiting = state
                        .slot_mut(self.id)
                        .is_some_and(|slot| matches!(slot.status, Status::Waiting));
                    if timed_out && still_waiting {
                        // Leave now, in this critical section: a slot still
                        // marked waiting after this returns could be picked
                        // for a hand-off to a thread that has gone.
                        state.remove(self.id);
                        return Turn::TimedOut;
                    }
                }
            }
        }
    }
}

impl<C, G: Clone> Member<'_, C, G> {
    /// Becomes the parker now if nobody of this process waits in Redis for
    /// the key (as [`next_turn`](Member::next_turn) would, without
    /// waiting); whether it did.
    pub(crate) fn park_at_once(&self) -> bool {
        let mut state = self.queue.state.lock();
        let has_parker = state.slots.iter().any(|s| s.status.is_parker());
        match state.slot_mut(self.id) {
            Some(slot) if !has_parker && matches!(slot.status, Status::Waiting) => {
                slot.status = Status::Parker;
                true
            }
            _ => false,
        }
    }

    /// The parker, before each attempt: `None` to go on and attempt
    /// (from then on nothing can reserve it until
    /// [`parker_parks`](Member::parker_parks)), or the lock a releasing
    /// thread handed it meanwhile. While it is reserved, it waits for the
    /// hand-off to be settled (the releaser's script returns within its
    /// I/O timeouts).
    pub(crate) fn parker_turn(&self) -> Option<G> {
        self.parker_settled(Status::ParkerAttempting)
    }

    /// The parker, after an attempt that found the object held, before it
    /// parks on `list`: a releasing thread may hand it the lock from now
    /// on (and end that park).
    pub(crate) fn parker_parks(&self, list: &str) {
        let mut state = self.queue.state.lock();
        if let Some(slot) = state.slot_mut(self.id) {
            slot.status = Status::Parker;
            if slot.parks_on.as_deref() != Some(list) {
                slot.parks_on = Some(list.to_owned());
            }
        }
    }

    /// The parker, leaving without the lock (its deadline, an error):
    /// `Some` when a releasing thread handed it the lock meanwhile, which
    /// it must take instead (else the lock would stay with a thread that
    /// is gone). While it is reserved, it waits for the hand-off to be
    /// settled.
    pub(crate) fn parker_leaves(&self) -> Option<G> {
        self.parker_settled(Status::Leaving)
    }

    /// The lock handed to the parker, if it was (once a hand-off under
    /// way is settled); if not, the parker goes on as `next`, which no
    /// releasing thread picks.
    fn parker_settled(&self, next: Status<G>) -> Option<G> {
        let mut state = self.queue.state.lock();
        loop {
            let slot = state.slot_mut(self.id)?;
            match slot.status {
                Status::ParkerReserved => {
                    let wake = Arc::clone(&slot.wake);
                    wake.condvar.wait(&mut state);
                }
                Status::Granted(ref grant) => return Some(grant.clone()),
                _ => {
                    slot.status = next;
                    return None;
                }
            }
        }
    }
}

impl<C, G> Drop for Member<'_, C, G> {
    fn drop(&mut self) {
        let mut queues = self.queues.queues.lock();
        let mut state = self.queue.state.lock();
        state.remove(self.id);
        if state.slots.is_empty() {
            queues.remove(&self.lock_key);
        }
    }
}

/// A waiter set aside for a hand-off; settle it with [`grant`] or
/// [`fail`]. Dropping it unsettled counts as a failure.
///
/// [`grant`]: Reservation::grant
/// [`fail`]: Reservation::fail
#[derive(Debug)]
pub(crate) struct Reservation<C, G> {
    queue: Arc<Queue<C, G>>,
    id: u64,
    /// What the waiter asked for.
    pub(crate) claim: C,
    /// A reserved parker's: the list it parks on, if it has parked (see
    /// [`LocalQueues::reserve_parker`]), which the releaser rings once the
    /// hand-off is settled.
    pub(crate) parks_on: Option<String>,
    settled: bool,
}

impl<C, G> Reservation<C, G> {
    /// The hand-off script ran: the waiter owns the lock.
    pub(crate) fn grant(mut self, grant: G) {
        self.settle(Status::Granted(grant));
    }

    /// The hand-off did not happen, or its outcome is unknown: the waiter
    /// looks at the lock once itself and waits on.
    pub(crate) fn fail(mut self) {
        self.settle(Status::Retry);
    }

    fn settle(&mut self, status: Status<G>) {
        self.settled = true;
        let mut state = self.queue.state.lock();
        if matches!(status, Status::Granted(_)) {
            if state.handoffs_in_a_row == 0 {
                state.run_started = Some(Instant::now());
            }
            state.handoffs_in_a_row += 1;
        }
        if let Some(slot) = state.slot_mut(self.id) {
            // A parker whose hand-off failed goes on as the parker: its
            // next attempt comes when its park ends (the releaser ends it
            // when the hand-off may have happened unseen).
            slot.status = match (&slot.status, status) {
                (Status::ParkerReserved, Status::Retry) => Status::Parker,
                (_, status) => status,
            };
            slot.wake.poke();
        }
    }
}

impl<C, G> Drop for Reservation<C, G> {
    fn drop(&mut self) {
        if !self.settled {
            self.settle(Status::Retry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queues of the tests: waiters named by a string, grants of a
    /// number.
    type Queues = LocalQueues<&'static str, u64>;

    #[test]
    fn the_first_waiter_parks_and_the_next_takes_over_when_it_leaves() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let first = queues.join("k", "a");
        let second = queues.join("k", "b");
        assert_eq!(first.next_turn(None), Turn::Park);
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(second.next_turn(Some(soon)), Turn::TimedOut, "one parker");
        drop(second);
        let third = queues.join("k", "c");
        drop(first);
        assert_eq!(third.next_turn(Some(soon)), Turn::Park, "takes over");
        drop(third);
        assert!(!queues.has_waiters("k"));
    }

    #[test]
    fn a_hand_off_goes_to_the_spinner_until_the_oldest_has_been_passed_over_the_fair_interval() {
        let queues = Queues::new(100, Duration::from_secs(60));
        let members: Vec<_> = ["p", "w1", "w2", "w3"]
            .into_iter()
            .map(|id| queues.join("k", id))
            .collect();
        assert_eq!(members[0].next_turn(None), Turn::Park);
        let queue = Arc::clone(&members[0].queue);
        // Each round's waiters all waiting again (the one reserved in the
        // round before, too), `member` spinning.
        let spin = |member: &Member<'_, &'static str, u64>, last_fair: Option<Instant>| {
            let mut state = queue.state.lock();
            for slot in state.slots.iter_mut().skip(1) {
                slot.status = Status::Waiting;
            }
            state.spinner = Some(member.id);
            state.last_fair = last_fair;
        };
        // Nobody was served yet: the oldest first.
        spin(&members[3], None);
        let reservation = queues.reserve("k").expect("waiters");
        assert_eq!(reservation.claim, "w1");
        reservation.fail();
        // The oldest was served just now: the spinner, however new.
        spin(&members[3], Some(Instant::now()));
        let reservation = queues.reserve("k").expect("waiters");
        assert_eq!(reservation.claim, "w3");
        reservation.fail();
        // Passed over the whole interval: the oldest again, and the
        // interval starts anew.
        spin(&members[3], Some(Instant::now() - FAIR_INTERVAL));
        let reservation = queues.reserve("k").expect("waiters");
        assert_eq!(reservation.claim, "w1");
        assert!(queue.state.lock().last_fair.unwrap().elapsed() < FAIR_INTERVAL);
        reservation.fail();
        // A spinner that is the oldest is the oldest.
        spin(&members[1], Some(Instant::now()));
        let reservation = queues.reserve("k").expect("waiters");
        assert_eq!(reservation.claim, "w1");
        reservation.fail();
    }

    #[test]
    fn a_waiter_spinning_when_it_is_handed_the_lock_takes_it() {
        let queues = Queues::new(100, Duration::from_secs(60));
        let parker = queues.join("k", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        let queue = Arc::clone(&parker.queue);
        queue.state.lock().last_fair = Some(Instant::now());
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let member = queues.join("k", "w");
                member.next_turn(Some(Instant::now() + Duration::from_secs(10)))
            });
            // Handed over while it spins (as it nearly always is: were it
            // missed, the hand-off would wake it from its sleep).
            let start = Instant::now();
            while queue.state.lock().spinner.is_none() && start.elapsed() < Duration::from_secs(1) {
                std::thread::yield_now();
            }
            let reservation = queues.reserve("k").expect("the waiter waits");
            let granted = Instant::now();
            reservation.grant(7);
            assert_eq!(waiter.join().unwrap(), Turn::Granted(7));
            // Taken at once, not found at the waiter's deadline (10 s) by
            // a sleep that missed the hand-off.
            assert!(granted.elapsed() < Duration::from_secs(5));
        });
    }

    #[test]
    fn a_waiter_of_a_queue_without_hand_offs_sleeps_at_once() {
        let queues = Queues::new(0, Duration::from_secs(60));
        let parker = queues.join("k", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        let queue = Arc::clone(&parker.queue);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let member = queues.join("k", "w");
                member.next_turn(Some(Instant::now() + Duration::from_millis(50)))
            });
            // Watched until the waiter times out: it never spins (one
            // that did would be seen in its first 50 µs).
            let mut spun = false;
            while !waiter.is_finished() {
                spun |= queue.state.lock().spinner.is_some();
                std::thread::yield_now();
            }
            assert_eq!(waiter.join().unwrap(), Turn::TimedOut);
            assert!(!spun, "a waiter that nothing can be handed to spun");
        });
    }

    #[test]
    fn a_hand_off_goes_to_the_oldest_waiter_not_parked_and_runs_are_bounded() {
        let queues = Queues::new(1, Duration::from_secs(60));
        let members: Vec<_> = ["p", "w1", "w2"]
            .into_iter()
            .map(|id| queues.join("k", id))
            .collect();
        assert_eq!(members[0].next_turn(None), Turn::Park);
        let reservation = queues.reserve("k").expect("w1 waits");
        assert_eq!(reservation.claim, "w1");
        let grant = 9;
        reservation.grant(grant);
        assert_eq!(members[1].next_turn(None), Turn::Granted(grant));
        assert!(
            queues.reserve("k").is_none(),
            "one local hand-off in a row at most"
        );
        queues.released_globally("k");
        let reservation = queues.reserve("k").expect("w2 waits");
        assert_eq!(reservation.claim, "w2");
        reservation.fail();
        assert_eq!(members[2].next_turn(None), Turn::Retry);
    }

    #[test]
    fn a_waiter_that_timed_out_cannot_be_picked_before_it_is_dropped() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let parker = queues.join("k", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        let waiter = queues.join("k", "w");
        assert_eq!(waiter.next_turn(Some(Instant::now())), Turn::TimedOut);
        // The member still exists (its thread has not dropped it yet), but
        // it is no longer a candidate for a hand-off.
        assert!(queues.reserve("k").is_none());
        drop(waiter);
    }

    #[test]
    fn a_waiter_making_its_retry_attempt_cannot_be_picked() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let parker = queues.join("k", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        let waiter = queues.join("k", "w");
        queues.reserve("k").unwrap().fail();
        assert_eq!(waiter.next_turn(None), Turn::Retry);
        assert!(queues.reserve("k").is_none(), "busy with its attempt");
        let soon = Instant::now() + Duration::from_millis(10);
        assert_eq!(waiter.next_turn(Some(soon)), Turn::TimedOut);
    }

    #[test]
    fn a_reserved_waiter_does_not_time_out_before_the_reservation_is_settled() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let parker = queues.join("k", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        let waiter = queues.join("k", "w");
        let reservation = queues.reserve("k").unwrap();
        let grant = 3;
        std::thread::scope(|scope| {
            let settle = scope.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                reservation.grant(grant);
            });
            // Its deadline passes during the hand-off, and still it gets the lock.
            let deadline = Instant::now() + Duration::from_millis(10);
            assert_eq!(waiter.next_turn(Some(deadline)), Turn::Granted(grant));
            settle.join().unwrap();
        });
    }

    #[test]
    fn a_parker_is_reserved_only_between_its_attempts_and_takes_the_grant_at_its_next_turn() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let parker = queues.join("own", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        assert_eq!(parker.parker_turn(), None, "nothing handed yet: attempt");
        assert!(
            queues.reserve_parker("own").is_none(),
            "busy with its attempt"
        );
        parker.parker_parks("list");
        assert!(queues.reserve("own").is_none(), "a parker is not Waiting");
        let reservation = queues.reserve_parker("own").expect("parked");
        assert_eq!(reservation.parks_on.as_deref(), Some("list"));
        assert!(queues.reserve_parker("own").is_none(), "reserved once");
        reservation.grant(5);
        assert_eq!(parker.parker_turn(), Some(5));
    }

    #[test]
    fn only_a_waiter_with_nobody_parked_before_it_parks_at_once() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let first = queues.join("k", "a");
        let second = queues.join("k", "b");
        assert!(first.park_at_once());
        assert!(!second.park_at_once(), "one parker");
        drop(first);
        assert!(second.park_at_once(), "the parker left");
    }

    #[test]
    fn a_parker_whose_hand_off_failed_parks_on_and_may_be_reserved_again() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let parker = queues.join("own", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        queues
            .reserve_parker("own")
            .expect("not attempting yet")
            .fail();
        assert!(queues.reserve_parker("own").is_some(), "still the parker");
        // That reservation was dropped unsettled: a failure too.
        assert_eq!(parker.parker_turn(), None, "attempts");
    }

    #[test]
    fn a_parker_leaving_while_reserved_waits_for_the_hand_off_and_takes_the_lock() {
        let queues = Queues::new(8, Duration::from_secs(60));
        let parker = queues.join("own", "p");
        assert_eq!(parker.next_turn(None), Turn::Park);
        parker.parker_parks("list");
        let reservation = queues.reserve_parker("own").unwrap();
        std::thread::scope(|scope| {
            let settle = scope.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                reservation.grant(7);
            });
            assert_eq!(parker.parker_leaves(), Some(7));
            settle.join().unwrap();
        });
        let leaving = queues.join("own2", "q");
        assert_eq!(leaving.next_turn(None), Turn::Park);
        assert_eq!(leaving.parker_leaves(), None);
        assert!(
            queues.reserve_parker("own2").is_none(),
            "a parker that left is never handed the lock"
        );
    }

    #[test]
    fn a_run_of_hand_offs_ends_once_it_has_lasted_the_run_limit() {
        let queues = Queues::new(1_000, Duration::from_millis(30));
        let members: Vec<_> = ["p", "w1", "w2", "w3"]
            .into_iter()
            .map(|id| queues.join("k", id))
            .collect();
        assert_eq!(members[0].next_turn(None), Turn::Park);
        queues.reserve("k").expect("w1").grant(1);
        queues
            .reserve("k")
            .expect("w2: the run just began")
            .grant(2);
        std::thread::sleep(Duration::from_millis(40));
        assert!(queues.reserve("k").is_none(), "the run has lasted 30 ms");
        queues.released_globally("k");
        assert_eq!(queues.reserve("k").expect("a new run").claim, "w3");
    }
}

//! Threads of one process waiting for the same lock name: a FIFO queue per
//! (client, lock name), the parker role, and local hand-offs.
//!
//! One waiter at a time is the *parker*: it waits in Redis (`BLPOP`) for
//! the whole queue. The others sleep on their own condition variable. A
//! thread of this process that releases the lock while waiters are queued
//! here hands it to the oldest waiter that is not parked in Redis: it
//! *reserves* that waiter, runs the hand-off script, and then either grants
//! the waiter the lock (it owns it without a round trip of its own) or tells
//! it to look again. A reserved waiter does not leave, even at its deadline,
//! until the reservation is settled, so the lock is never handed to a thread
//! that has given up. After a run of hand-offs the holder releases globally
//! instead (baton in Redis), so that other processes get their turn.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::ownership::LeaseMode;

/// A lock handed over by a local releaser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The fencing token of the new ownership.
    pub(crate) fence: u64,
    /// When the hand-off script was sent: where the new lease starts at
    /// the latest.
    pub(crate) sent: Instant,
}

/// What a waiting thread should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Wait in Redis for the queue (this thread is the parker now).
    Park,
    /// The lock was handed to this thread.
    Granted(Grant),
    /// A hand-off to this thread failed and may or may not have happened:
    /// make one attempt, then wait again.
    Retry,
    /// The deadline passed.
    TimedOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Asleep in `next_turn`: the only status a hand-off may pick.
    Waiting,
    /// Waiting in Redis for the queue.
    Parker,
    /// Picked for a hand-off that is under way.
    Reserved,
    Granted(Grant),
    /// A hand-off failed: the thread should look at the lock itself.
    Retry,
    /// Out of `next_turn`, making that attempt: not to be picked, for the
    /// attempt may win the lock and the thread leave.
    Attempting,
}

#[derive(Debug)]
struct Slot {
    id: u64,
    identity: Arc<str>,
    mode: LeaseMode,
    status: Status,
    wake: Arc<Condvar>,
}

#[derive(Debug, Default)]
struct QueueState {
    /// In arrival order; the parker and reserved waiters included.
    slots: VecDeque<Slot>,
    next_id: u64,
    /// Local hand-offs since the lock was last released globally.
    handoffs_in_a_row: u32,
}

impl QueueState {
    fn slot_mut(&mut self, id: u64) -> Option<&mut Slot> {
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
        if self.slots.iter().any(|s| s.status == Status::Parker) {
            return;
        }
        if let Some(slot) = self.slots.iter().find(|s| s.status == Status::Waiting) {
            slot.wake.notify_one();
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
}

/// The queues of one client, by lock key.
#[derive(Debug)]
pub(crate) struct LocalQueues {
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    handoff_limit: u32,
}

impl LocalQueues {
    /// Queues whose locks are handed on locally at most `handoff_limit`
    /// times in a row (0: never).
    pub(crate) fn new(handoff_limit: u32) -> Self {
        LocalQueues {
            queues: Mutex::new(HashMap::new()),
            handoff_limit,
        }
    }

    /// Whether threads of this client are waiting for `lock_key`: a newcomer
    /// then queues behind them instead of trying first (no barging).
    pub(crate) fn has_waiters(&self, lock_key: &str) -> bool {
        self.queues.lock().contains_key(lock_key)
    }

    /// Queues the calling thread (`identity`, wanting a lease of `mode`).
    pub(crate) fn join(&self, lock_key: &str, identity: &Arc<str>, mode: LeaseMode) -> Member<'_> {
        // Joined while the map is locked, so that a member leaving at the
        // same moment cannot remove the queue this one is joining.
        let mut queues = self.queues.lock();
        let queue = Arc::clone(queues.entry(lock_key.to_owned()).or_default());
        let mut state = queue.state.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.slots.push_back(Slot {
            id,
            identity: Arc::clone(identity),
            mode,
            status: Status::Waiting,
            wake: Arc::new(Condvar::new()),
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

    /// For a thread releasing `lock_key` for good: reserves the oldest
    /// waiter not parked in Redis, unless there is none or the run of local
    /// hand-offs is at its limit.
    pub(crate) fn reserve(&self, lock_key: &str) -> Option<Reservation> {
        let queue = Arc::clone(self.queues.lock().get(lock_key)?);
        let mut state = queue.state.lock();
        if state.handoffs_in_a_row >= self.handoff_limit {
            return None;
        }
        let slot = state
            .slots
            .iter_mut()
            .find(|s| s.status == Status::Waiting)?;
        slot.status = Status::Reserved;
        let (id, identity, mode) = (slot.id, Arc::clone(&slot.identity), slot.mode);
        state.ensure_parker();
        drop(state);
        Some(Reservation {
            queue,
            id,
            identity,
            mode,
            settled: false,
        })
    }

    /// The lock was released in Redis (baton pushed): a new run of local
    /// hand-offs may start.
    pub(crate) fn released_globally(&self, lock_key: &str) {
        let queue = self.queues.lock().get(lock_key).cloned();
        if let Some(queue) = queue {
            queue.state.lock().handoffs_in_a_row = 0;
        }
    }
}

/// A thread's place in the queue of one lock name; leaving (drop) hands the
/// parker role on.
#[derive(Debug)]
pub(crate) struct Member<'a> {
    queues: &'a LocalQueues,
    lock_key: String,
    queue: Arc<Queue>,
    id: u64,
}

impl Member<'_> {
    /// Sleeps until this thread has something to do, or `deadline` passes.
    ///
    /// Without a deadline, and while reserved for a hand-off, the sleep has
    /// no timeout: a parker's own waits are bounded (its `BLPOP` by the park
    /// time, its socket by the I/O timeout) and its leaving wakes the next;
    /// a reservation is settled when the releaser's script returns, within
    /// its I/O timeouts, or when the reservation is dropped.
    pub(crate) fn next_turn(&self, deadline: Option<Instant>) -> Turn {
        let mut state = self.queue.state.lock();
        loop {
            let has_parker = state.slots.iter().any(|s| s.status == Status::Parker);
            let Some(slot) = state.slot_mut(self.id) else {
                return Turn::TimedOut;
            };
            let wake = Arc::clone(&slot.wake);
            match slot.status {
                Status::Granted(grant) => return Turn::Granted(grant),
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
                Status::Reserved => wake.wait(&mut state),
                Status::Waiting => {
                    let Some(deadline) = deadline else {
                        wake.wait(&mut state);
                        continue;
                    };
                    let timed_out = wake.wait_until(&mut state, deadline).timed_out();
                    let still_waiting = state
                        .slot_mut(self.id)
                        .is_some_and(|slot| slot.status == Status::Waiting);
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

impl Drop for Member<'_> {
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
pub(crate) struct Reservation {
    queue: Arc<Queue>,
    id: u64,
    /// Who gets the lock.
    pub(crate) identity: Arc<str>,
    /// The lease the waiter asked for.
    pub(crate) mode: LeaseMode,
    settled: bool,
}

impl Reservation {
    /// The hand-off script ran: the waiter owns the lock.
    pub(crate) fn grant(mut self, grant: Grant) {
        self.settle(Status::Granted(grant));
    }

    /// The hand-off did not happen, or its outcome is unknown: the waiter
    /// looks at the lock once itself and waits on.
    pub(crate) fn fail(mut self) {
        self.settle(Status::Retry);
    }

    fn settle(&mut self, status: Status) {
        self.settled = true;
        let mut state = self.queue.state.lock();
        if matches!(status, Status::Granted(_)) {
            state.handoffs_in_a_row += 1;
        }
        if let Some(slot) = state.slot_mut(self.id) {
            slot.status = status;
            slot.wake.notify_one();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.settle(Status::Retry);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn mode() -> LeaseMode {
        LeaseMode::Renewed(Duration::from_secs(30))
    }

    #[test]
    fn the_first_waiter_parks_and_the_next_takes_over_when_it_leaves() {
        let queues = LocalQueues::new(8);
        let (a, b, c) = (Arc::from("a"), Arc::from("b"), Arc::from("c"));
        let first = queues.join("k", &a, mode());
        let second = queues.join("k", &b, mode());
        assert_eq!(first.next_turn(None), Turn::Park);
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(second.next_turn(Some(soon)), Turn::TimedOut, "one parker");
        drop(second);
        let third = queues.join("k", &c, mode());
        drop(first);
        assert_eq!(third.next_turn(Some(soon)), Turn::Park, "takes over");
        drop(third);
        assert!(!queues.has_waiters("k"));
    }

    #[test]
    fn a_hand_off_goes_to_the_oldest_waiter_not_parked_and_runs_are_bounded() {
        let queues = LocalQueues::new(1);
        let ids: Vec<Arc<str>> = ["p", "w1", "w2"].into_iter().map(Arc::from).collect();
        let members: Vec<_> = ids.iter().map(|id| queues.join("k", id, mode())).collect();
        assert_eq!(members[0].next_turn(None), Turn::Park);
        let reservation = queues.reserve("k").expect("w1 waits");
        assert_eq!(&*reservation.identity, "w1");
        let grant = Grant {
            fence: 9,
            sent: Instant::now(),
        };
        reservation.grant(grant);
        assert_eq!(members[1].next_turn(None), Turn::Granted(grant));
        assert!(
            queues.reserve("k").is_none(),
            "one local hand-off in a row at most"
        );
        queues.released_globally("k");
        let reservation = queues.reserve("k").expect("w2 waits");
        assert_eq!(&*reservation.identity, "w2");
        reservation.fail();
        assert_eq!(members[2].next_turn(None), Turn::Retry);
    }

    #[test]
    fn a_waiter_that_timed_out_cannot_be_picked_before_it_is_dropped() {
        let queues = LocalQueues::new(8);
        let (p, w) = (Arc::from("p"), Arc::from("w"));
        let parker = queues.join("k", &p, mode());
        assert_eq!(parker.next_turn(None), Turn::Park);
        let waiter = queues.join("k", &w, mode());
        assert_eq!(waiter.next_turn(Some(Instant::now())), Turn::TimedOut);
        // The member still exists (its thread has not dropped it yet), but
        // it is no longer a candidate for a hand-off.
        assert!(queues.reserve("k").is_none());
        drop(waiter);
    }

    #[test]
    fn a_waiter_making_its_retry_attempt_cannot_be_picked() {
        let queues = LocalQueues::new(8);
        let (p, w) = (Arc::from("p"), Arc::from("w"));
        let parker = queues.join("k", &p, mode());
        assert_eq!(parker.next_turn(None), Turn::Park);
        let waiter = queues.join("k", &w, mode());
        queues.reserve("k").unwrap().fail();
        assert_eq!(waiter.next_turn(None), Turn::Retry);
        assert!(queues.reserve("k").is_none(), "busy with its attempt");
        let soon = Instant::now() + Duration::from_millis(10);
        assert_eq!(waiter.next_turn(Some(soon)), Turn::TimedOut);
    }

    #[test]
    fn a_reserved_waiter_does_not_time_out_before_the_reservation_is_settled() {
        let queues = LocalQueues::new(8);
        let (p, w) = (Arc::from("p"), Arc::from("w"));
        let parker = queues.join("k", &p, mode());
        assert_eq!(parker.next_turn(None), Turn::Park);
        let waiter = queues.join("k", &w, mode());
        let reservation = queues.reserve("k").unwrap();
        let grant = Grant {
            fence: 3,
            sent: Instant::now(),
        };
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
}

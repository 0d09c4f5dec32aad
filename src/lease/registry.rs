//! The ownerships this client holds: one entry per (lock, thread), shared
//! by the guards of that thread (re-entry), with the state the watchdog
//! renews and the guards read.
//!
//! An entry is filed under the thread that holds it now, and records the
//! *identity* it is held as in Redis: the identity of the thread that took
//! it there, which may have passed it on in memory to another thread of
//! this client since (a local hand-off that sends nothing to Redis: see
//! [`Ownerships::pass`]). So a thread that asks Redis for a lock it passed
//! on must ask for it free only ([`Ownerships::lent`]): Redis would take
//! the other thread's hold for a leftover of its own.
//!
//! An ownership has one lease mode, set by the acquisition that created it:
//! a thread that re-enters through a handle with another lease mode joins
//! the ownership as it is. Nothing but a release (or the lease running out)
//! ends an ownership earlier than it would end anyway: re-entry, inner
//! releases, renewals and `extend` only ever push its end out (the scripts
//! enforce it in Redis, `LeaseStatus::lives_from` here).
//!
//! The table's mutex is never held across a network call: the watchdog
//! takes a snapshot of what is due, sends the round unlocked, and applies
//! the replies to the entries that are still there.

use std::collections::hash_map::{Entry as Slot, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{FairRun, LeaseMode, LeaseStatus, Leased, Passed};
use crate::observe::LostReason;

/// One ownership: a lock held by one thread under one fencing token.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) leased: Leased,
    /// The thread that holds it now (the entry is filed under it).
    thread: Arc<str>,
    /// The identity it is held as in Redis.
    pub(crate) identity: Arc<str>,
    /// The fencing token Redis issued it.
    pub(crate) fence: u64,
    /// The token of the current thread's hold: `fence`, plus one per
    /// in-memory hand-off since Redis issued it.
    token: u64,
    /// Set by the acquisition that created the ownership.
    mode: LeaseMode,
    /// Live guards of this ownership (0 while its last guard's release is
    /// deciding whether to pass it on).
    guards: usize,
    /// Set when any acquisition of this ownership asked for renewal.
    pub(crate) renewal: Option<Renewal>,
    pub(crate) status: Arc<LeaseStatus>,
    /// A fair lock's run of in-memory hand-offs: set by the acquisition
    /// that created the ownership, advanced by each pass.
    run: FairRun,
}

/// The watchdog's schedule for one ownership.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal {
    pub(crate) lease: Duration,
    /// When to renew next.
    pub(crate) due: Instant,
}

impl Renewal {
    fn new(lease: Duration, sent: Instant) -> Self {
        Renewal {
            lease,
            due: sent + lease / 3,
        }
    }

    /// A renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&mut self, sent: Instant) {
        *self = Renewal::new(self.lease, sent);
    }
}

/// What a thread holds on a lock through its live guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The identity the ownership is held as in Redis.
    pub(crate) identity: Arc<str>,
    /// The ownership's fencing token in Redis.
    pub(crate) fence: u64,
    /// The token of this thread's hold.
    pub(crate) token: u64,
    /// Its live guards.
    pub(crate) guards: usize,
    /// Its lease mode, set by the acquisition that created it.
    pub(crate) mode: LeaseMode,
}

/// What [`Ownerships::enter`] made of an acquisition.
#[derive(Debug)]
pub(crate) struct Entered {
    pub(crate) status: Arc<LeaseStatus>,
    /// The ownership's lease mode (that of its first acquisition).
    pub(crate) mode: LeaseMode,
    /// The token of the thread's hold (the same for every re-entry).
    pub(crate) token: u64,
    /// When the watchdog has a new ownership to renew: its first renewal.
    pub(crate) new_renewal: Option<Instant>,
    /// The ownership's fair run, as it stands (a run changes only when the
    /// ownership passes on, with no guard left): a re-entry's guard keeps
    /// it, in case it is released last after the watchdog has dropped a
    /// lost ownership's record with its run.
    pub(crate) run: FairRun,
}

/// An ownership whose renewal is due, copied out of the table so that the
/// watchdog can talk to Redis without holding it.
#[derive(Debug, Clone)]
pub(crate) struct DueRenewal {
    key: String,
    pub(crate) leased: Leased,
    pub(crate) identity: Arc<str>,
    pub(crate) fence: u64,
    pub(crate) renewal: Renewal,
    pub(crate) status: Arc<LeaseStatus>,
}

/// All ownerships of one client, by lock key (a handful of threads at most
/// per key: one for a plain lock, one per reader for a read hold).
#[derive(Debug, Default)]
pub(crate) struct Ownerships {
    entries: Mutex<HashMap<String, Vec<Entry>>>,
}

impl Ownerships {
    /// Records a guard of `thread`'s ownership `fence` of `leased`, held as
    /// `identity` in Redis, whose acquisition was sent at `sent` asking for
    /// `mode`. Returns the shared status, the ownership's lease mode (that
    /// of its first acquisition), its token, and, when the watchdog has a
    /// new ownership to renew, when its first renewal is due.
    pub(crate) fn enter(
        &self,
        leased: &Leased,
        thread: &Arc<str>,
        identity: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> Entered {
        let fresh = || Entry {
            leased: leased.clone(),
            thread: Arc::clone(thread),
            identity: Arc::clone(identity),
            fence,
            token: fence,
            mode,
            guards: 0,
            renewal: None,
            status: Arc::new(LeaseStatus::new(sent + mode.lease())),
            run: FairRun::default(),
        };
        let mut entries = self.entries.lock();
        let list = entries.entry(leased.key.to_string()).or_default();
        let at = match list.iter().position(|entry| entry.thread == *thread) {
            Some(at) if list[at].fence == fence && list[at].identity == *identity => at,
            Some(at) => {
                // The same thread took the lock afresh: the ownership its
                // older guards belong to is gone.
                list[at].status.mark_lost(LostReason::TakenOver);
                list[at] = fresh();
                at
            }
            None => {
                list.push(fresh());
                list.len() - 1
            }
        };
        let entry = &mut list[at];
        entry.guards += 1;
        let mut new_renewal = None;
        // The script made the lock live at least the ownership's lease more
        // (re-entry sends the ownership's lease, not the handle's).
        entry.status.lives_from(sent, entry.mode.lease());
        if let (LeaseMode::Renewed(lease), None) = (entry.mode, entry.renewal) {
            let renewal = Renewal::new(lease, sent);
            new_renewal = Some(renewal.due);
            entry.renewal = Some(renewal);
        }
        Entered {
            status: Arc::clone(&entry.status),
            mode: entry.mode,
            token: entry.token,
            new_renewal,
            run: entry.run.clone(),
        }
    }

    /// Sets the run of `thread`'s ownership of `key` whose status is
    /// `status`: a fair lock's, taken afresh with threads of this client
    /// next in its queue.
    pub(crate) fn start_run(
        &self,
        key: &str,
        thread: &Arc<str>,
        status: &Arc<LeaseStatus>,
        run: FairRun,
    ) {
        let mut entries = self.entries.lock();
        let entry = entries.get_mut(key).and_then(|list| {
            list.iter_mut()
                .find(|entry| entry.thread == *thread && Arc::ptr_eq(&entry.status, status))
        });
        if let Some(entry) = entry {
            entry.run = run;
        }
    }

    /// The run of `thread`'s ownership of `key` whose status is `status`
    /// (empty when it has none, or is no longer recorded).
    pub(crate) fn run(&self, key: &str, thread: &Arc<str>, status: &Arc<LeaseStatus>) -> FairRun {
        let entries = self.entries.lock();
        entries
            .get(key)
            .and_then(|list| {
                list.iter()
                    .find(|entry| entry.thread == *thread && Arc::ptr_eq(&entry.status, status))
            })
            .map(|entry| entry.run.clone())
            .unwrap_or_default()
    }

    /// The ownership `thread` holds on `key` through live guards.
    pub(crate) fn held(&self, key: &str, thread: &Arc<str>) -> Option<Held> {
        let entries = self.entries.lock();
        let entry = entries
            .get(key)?
            .iter()
            .find(|entry| entry.thread == *thread && entry.guards > 0)?;
        Some(Held {
            identity: Arc::clone(&entry.identity),
            fence: entry.fence,
            token: entry.token,
            guards: entry.guards,
            mode: entry.mode,
        })
    }

    /// Whether an ownership of `key` that `thread` took in Redis (held as
    /// its identity there) is held by another thread of this client now,
    /// or being released by one: `thread` passed it on in memory, so a
    /// lock under its identity in Redis is not a leftover of its own.
    pub(crate) fn lent(&self, key: &str, thread: &Arc<str>) -> bool {
        self.entries.lock().get(key).is_some_and(|list| {
            list.iter()
                .any(|entry| entry.identity == *thread && entry.thread != *thread)
        })
    }

    /// Forgets one guard of `thread`'s ownership whose status is `status`
    /// and returns how many are left; the last guard removes the entry
    /// (unless `keep_last`: then it stays, with no guard, until
    /// [`pass`](Ownerships::pass) or [`forget`](Ownerships::forget) settles
    /// it, so that no other thread of this client asks Redis for the lock
    /// meanwhile), and the watchdog never renews it again. `None` when the
    /// ownership is no longer recorded (it was lost).
    ///
    /// Called before the release script is sent, so that the watchdog stops
    /// renewing. A renewal already in flight may still reach Redis after the
    /// release; it changes nothing there, because the renewal script checks
    /// the owner and the fencing token and never re-creates a lock.
    pub(crate) fn leave(
        &self,
        key: &str,
        thread: &Arc<str>,
        status: &Arc<LeaseStatus>,
        keep_last: bool,
    ) -> Option<usize> {
        let mut entries = self.entries.lock();
        let Slot::Occupied(mut slot) = entries.entry(key.to_owned()) else {
            return None;
        };
        let list = slot.get_mut();
        let at = list
            .iter()
            .position(|entry| entry.thread == *thread && Arc::ptr_eq(&entry.status, status))?;
        let entry = &mut list[at];
        entry.guards = entry.guards.saturating_sub(1);
        let left = entry.guards;
        if left == 0 && !keep_last {
            list.swap_remove(at);
            if list.is_empty() {
                slot.remove();
            }
        }
        Some(left)
    }

    /// Hands `thread`'s ownership whose status is `status` (its last guard
    /// released, kept by [`leave`](Ownerships::leave)) to thread `to` of
    /// this client, in memory: the entry is filed under `to` with one guard
    /// and the next token. Redis is not told: the ownership keeps its
    /// identity, fencing token, lease and renewals (also returned: when
    /// the next is due, for the watchdog, which left it alone while it had
    /// no guard). `None` when the ownership is no longer recorded (it was
    /// found lost meanwhile).
    pub(crate) fn pass(
        &self,
        key: &str,
        thread: &Arc<str>,
        status: &Arc<LeaseStatus>,
        to: &Arc<str>,
    ) -> Option<(Passed, Option<Instant>)> {
        let mut entries = self.entries.lock();
        let list = entries.get_mut(key)?;
        let entry = list
            .iter_mut()
            .find(|entry| entry.thread == *thread && Arc::ptr_eq(&entry.status, status))?;
        entry.thread = Arc::clone(to);
        entry.token += 1;
        entry.guards = 1;
        entry.run = entry.run.advanced();
        let passed = Passed {
            identity: Arc::clone(&entry.identity),
            fence: entry.fence,
            token: entry.token,
            mode: entry.mode,
            status: Arc::clone(&entry.status),
            run: entry.run.clone(),
        };
        Some((passed, entry.renewal.map(|renewal| renewal.due)))
    }

    /// Removes `thread`'s ownership of `status` (it was found lost, or its
    /// last release kept it only to decide whether to pass it on).
    pub(crate) fn forget(&self, key: &str, thread: &Arc<str>, status: &Arc<LeaseStatus>) {
        let mut entries = self.entries.lock();
        if let Slot::Occupied(mut slot) = entries.entry(key.to_owned()) {
            let list = slot.get_mut();
            list.retain(|entry| !(entry.thread == *thread && Arc::ptr_eq(&entry.status, status)));
            if list.is_empty() {
                slot.remove();
            }
        }
    }

    /// When the watchdog should next renew, if anything is renewed.
    /// Ownerships being released (no guard left, kept by
    /// [`leave`](Ownerships::leave)) are not renewed: a renewal sent after
    /// the release would find the lock gone and report it lost.
    pub(crate) fn next_renewal(&self) -> Option<Instant> {
        self.entries
            .lock()
            .values()
            .flatten()
            .filter(|entry| entry.guards > 0)
            .filter_map(|entry| entry.renewal.map(|r| r.due))
            .min()
    }

    /// Copies of the renewed ownerships due by `now` or within a sixth of
    /// their lease after it, so that locks taken at nearby moments share a
    /// round trip.
    pub(crate) fn due_renewals(&self, now: Instant) -> Vec<DueRenewal> {
        let entries = self.entries.lock();
        let mut due: Vec<DueRenewal> = entries
            .iter()
            .flat_map(|(key, list)| list.iter().map(move |entry| (key, entry)))
            // Being released: see `next_renewal`.
            .filter(|(_, entry)| entry.guards > 0)
            .filter_map(|(key, entry)| {
                let renewal = entry.renewal?;
                (renewal.due <= now + renewal.lease / 6).then(|| DueRenewal {
                    key: key.clone(),
                    leased: entry.leased.clone(),
                    identity: Arc::clone(&entry.identity),
                    fence: entry.fence,
                    renewal,
                    status: Arc::clone(&entry.status),
                })
            })
            .collect();
        due.sort_by(|a, b| (&a.key, &a.identity).cmp(&(&b.key, &b.identity)));
        due
    }

    /// Applies `update` to the renewal of `due`'s ownership if it is still
    /// in the table (its guards may have released it meanwhile; it may
    /// have been passed to another thread, whose hold it renews all the
    /// same); removes it when the update marked it lost. Marked, not merely
    /// out of time by now: a renewal that failed just before the lease's
    /// end is tried again, and that round marks it lost and tells its loss
    /// signal and the event hook (forgetting it here would tell nobody).
    pub(crate) fn update_renewal(&self, due: &DueRenewal, update: impl FnOnce(&mut Renewal)) {
        let mut entries = self.entries.lock();
        let Slot::Occupied(mut slot) = entries.entry(due.key.clone()) else {
            return;
        };
        let list = slot.get_mut();
        let Some(at) = list
            .iter()
            .position(|entry| Arc::ptr_eq(&entry.status, &due.status))
        else {
            return;
        };
        if let Some(renewal) = list[at].renewal.as_mut() {
            update(renewal);
        }
        if list[at].status.is_marked_lost() {
            list.swap_remove(at);
            if list.is_empty() {
                slot.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::lease::{RenewLeases, RenewOutcome, RenewRequest};

    #[derive(Debug)]
    struct NoRenewals;

    impl RenewLeases for NoRenewals {
        fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome> {
            vec![RenewOutcome::Retry; requests.len()]
        }
    }

    fn keys() -> Leased {
        Leased {
            name: "n".into(),
            kind: crate::observe::HoldKind::Lock,
            key: "p:{n}:lock".into(),
            renewer: Arc::new(NoRenewals),
        }
    }

    /// A thread's own acquisition: held as its own identity.
    fn enter(
        ownerships: &Ownerships,
        id: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> Entered {
        ownerships.enter(&keys(), id, id, fence, mode, sent)
    }

    #[test]
    fn reentry_shares_one_entry_and_the_last_guard_removes_it() {
        let ownerships = Ownerships::default();
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let a = enter(&ownerships, &id, 7, mode, now);
        let b = enter(&ownerships, &id, 7, mode, now);
        assert!(Arc::ptr_eq(&a.status, &b.status));
        assert!(
            a.new_renewal.is_some() && b.new_renewal.is_none(),
            "one watchdog entry"
        );
        assert_eq!(
            ownerships.held(&keys.key, &id),
            Some(Held {
                identity: Arc::clone(&id),
                fence: 7,
                token: 7,
                guards: 2,
                mode
            })
        );
        assert_eq!(ownerships.leave(&keys.key, &id, &a.status, false), Some(1));
        assert_eq!(ownerships.leave(&keys.key, &id, &b.status, false), Some(0));
        assert_eq!(ownerships.held(&keys.key, &id), None);
        assert!(ownerships.entries.lock().is_empty());
    }

    #[test]
    fn a_fresh_ownership_marks_the_old_one_lost_and_old_guards_cannot_remove_it() {
        let ownerships = Ownerships::default();
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let old = enter(&ownerships, &id, 1, mode, now).status;
        let new = enter(&ownerships, &id, 2, mode, now).status;
        assert!(old.is_lost() && !new.is_lost());
        assert_eq!(ownerships.leave(&keys.key, &id, &old, false), None);
        assert_eq!(
            ownerships
                .held(&keys.key, &id)
                .map(|held| (held.fence, held.guards)),
            Some((2, 1)),
            "the new ownership stays"
        );
    }

    #[test]
    fn a_passed_ownership_keeps_its_identity_and_renewal_under_the_next_token() {
        let ownerships = Ownerships::default();
        let (keys, now) = (keys(), Instant::now());
        let (first, second): (Arc<str>, Arc<str>) = (Arc::from("t1"), Arc::from("t2"));
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let entered = enter(&ownerships, &first, 40, mode, now);
        // The last guard leaves, the entry kept while the release decides.
        assert_eq!(
            ownerships.leave(&keys.key, &first, &entered.status, true),
            Some(0)
        );
        assert_eq!(ownerships.held(&keys.key, &first), None, "no live guard");
        assert!(
            !ownerships.lent(&keys.key, &first),
            "its own release is not a loan"
        );
        // Being released: the watchdog leaves it alone (a renewal after the
        // release would report it lost).
        let later = now + Duration::from_secs(30);
        assert!(ownerships.due_renewals(later).is_empty());
        assert_eq!(ownerships.next_renewal(), None);
        let (passed, due) = ownerships
            .pass(&keys.key, &first, &entered.status, &second)
            .expect("still recorded");
        assert_eq!(
            due,
            Some(now + Duration::from_secs(10)),
            "renewed as before"
        );
        assert_eq!(
            (&*passed.identity, passed.fence, passed.token),
            ("t1", 40, 41)
        );
        assert!(Arc::ptr_eq(&passed.status, &entered.status));
        assert_eq!(
            ownerships.held(&keys.key, &second),
            Some(Held {
                identity: Arc::clone(&first),
                fence: 40,
                token: 41,
                guards: 1,
                mode
            })
        );
        // The thread that took it in Redis must not take it for its own
        // leftover while the other holds it.
        assert!(ownerships.lent(&keys.key, &first));
        assert!(!ownerships.lent(&keys.key, &second));
        // Re-entry through Redis answers the ownership's fence: the same
        // entry, the same token.
        let again = ownerships.enter(&keys, &second, &first, 40, mode, now);
        assert_eq!(again.token, 41);
        assert!(Arc::ptr_eq(&again.status, &entered.status));
        assert_eq!(ownerships.held(&keys.key, &second).unwrap().guards, 2);
        // Renewals go on for whoever holds it.
        let due = ownerships.due_renewals(now + Duration::from_secs(30));
        assert_eq!(due.len(), 1);
        assert_eq!((&*due[0].identity, due[0].fence), ("t1", 40));
        let renewed = now + Duration::from_secs(20);
        ownerships.update_renewal(&due[0], |renewal| renewal.renewed(renewed));
        assert_eq!(
            ownerships.next_renewal(),
            Some(renewed + Duration::from_secs(10))
        );
        // Passed back and forth, the token keeps growing.
        assert_eq!(
            ownerships.leave(&keys.key, &second, &entered.status, true),
            Some(1)
        );
        assert_eq!(
            ownerships.leave(&keys.key, &second, &entered.status, true),
            Some(0)
        );
        let (back, _) = ownerships
            .pass(&keys.key, &second, &entered.status, &first)
            .unwrap();
        assert_eq!(back.token, 42);
        assert!(!ownerships.lent(&keys.key, &first), "its own again");
        ownerships.leave(&keys.key, &first, &entered.status, true);
        ownerships.forget(&keys.key, &first, &entered.status);
        assert!(ownerships.entries.lock().is_empty());
        assert!(ownerships
            .pass(&keys.key, &first, &entered.status, &second)
            .is_none());
    }

    #[test]
    fn a_lease_is_lost_when_it_ends_by_the_local_clock_unless_it_moved_out() {
        let ownerships = Ownerships::default();
        let id = Arc::from("me");
        let long_ago = Instant::now() - Duration::from_secs(2);
        let entered = enter(
            &ownerships,
            &id,
            1,
            LeaseMode::Fixed(Duration::from_secs(1)),
            long_ago,
        );
        let status = entered.status;
        assert!(entered.new_renewal.is_none());
        assert!(status.is_lost());
        assert!(!status.is_marked_lost(), "out of time, not found gone");
        status.lives_from(Instant::now(), Duration::from_secs(60));
        assert!(!status.is_lost(), "extended");
        status.lives_from(long_ago, Duration::from_secs(1));
        assert!(
            !status.is_lost(),
            "an earlier end never replaces a later one"
        );
    }

    #[test]
    fn reentry_keeps_the_lease_mode_of_the_first_acquisition() {
        let ownerships = Ownerships::default();
        let (id, now) = (Arc::from("me"), Instant::now());
        let renewed = LeaseMode::Renewed(Duration::from_secs(30));
        let short = LeaseMode::Fixed(Duration::from_millis(200));
        let outer = enter(&ownerships, &id, 1, renewed, now);
        let inner = enter(&ownerships, &id, 1, short, now);
        assert!(Arc::ptr_eq(&outer.status, &inner.status));
        assert_eq!((outer.mode, inner.mode), (renewed, renewed));
        assert!(inner.new_renewal.is_none(), "already renewed");
        let later = now + Duration::from_secs(1);
        assert!(
            !inner.status.is_lost(),
            "the 200 ms re-entry did not shorten it"
        );
        assert!(inner.status.valid_until() >= now + Duration::from_secs(30));
        assert_eq!(
            ownerships
                .due_renewals(later + Duration::from_secs(30))
                .len(),
            1
        );

        // And the other way round: a fixed ownership stays fixed.
        let other = Arc::from("other");
        let first = enter(&ownerships, &other, 2, short, now);
        let again = enter(&ownerships, &other, 2, renewed, now);
        assert_eq!(
            (first.mode, again.mode, again.new_renewal),
            (short, short, None)
        );
    }
}

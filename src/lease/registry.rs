//! The ownerships this client holds: one entry per (lock, thread identity),
//! shared by the guards of that thread (re-entry), with the state the
//! watchdog renews and the guards read.
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

use super::{LeaseMode, LeaseStatus, Leased};
use crate::observe::LostReason;

/// One ownership: a lock held by one identity under one fencing token.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) leased: Leased,
    pub(crate) identity: Arc<str>,
    pub(crate) fence: u64,
    /// Set by the acquisition that created the ownership.
    mode: LeaseMode,
    /// Live guards of this ownership.
    guards: usize,
    /// Set when any acquisition of this ownership asked for renewal.
    pub(crate) renewal: Option<Renewal>,
    pub(crate) status: Arc<LeaseStatus>,
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

type OwnershipKey = (String, Arc<str>);

/// What a thread holds on a lock through its live guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// The ownership's fencing token.
    pub(crate) fence: u64,
    /// Its live guards.
    pub(crate) guards: usize,
    /// Its lease mode, set by the acquisition that created it.
    pub(crate) mode: LeaseMode,
}

/// An ownership whose renewal is due, copied out of the table so that the
/// watchdog can talk to Redis without holding it.
#[derive(Debug, Clone)]
pub(crate) struct DueRenewal {
    key: OwnershipKey,
    pub(crate) leased: Leased,
    pub(crate) identity: Arc<str>,
    pub(crate) fence: u64,
    pub(crate) renewal: Renewal,
    pub(crate) status: Arc<LeaseStatus>,
}

/// All ownerships of one client.
#[derive(Debug, Default)]
pub(crate) struct Ownerships {
    entries: Mutex<HashMap<OwnershipKey, Entry>>,
}

impl Ownerships {
    /// Records a guard of the ownership `fence` of `leased` by `identity`,
    /// whose acquisition was sent at `sent` asking for `mode`. Returns the
    /// shared status, the ownership's lease mode (that of its first
    /// acquisition), and, when the watchdog has a new ownership to renew,
    /// when its first renewal is due.
    pub(crate) fn enter(
        &self,
        leased: &Leased,
        identity: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> (Arc<LeaseStatus>, LeaseMode, Option<Instant>) {
        let fresh = || Entry {
            leased: leased.clone(),
            identity: Arc::clone(identity),
            fence,
            mode,
            guards: 0,
            renewal: None,
            status: Arc::new(LeaseStatus::new(sent + mode.lease())),
        };
        let mut entries = self.entries.lock();
        let entry = match entries.entry((leased.key.to_string(), Arc::clone(identity))) {
            Slot::Occupied(slot) if slot.get().fence == fence => slot.into_mut(),
            Slot::Occupied(mut slot) => {
                // The same thread took the lock afresh: the ownership its
                // older guards belong to is gone.
                slot.get().status.mark_lost(LostReason::TakenOver);
                slot.insert(fresh());
                slot.into_mut()
            }
            Slot::Vacant(slot) => slot.insert(fresh()),
        };
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
        (Arc::clone(&entry.status), entry.mode, new_renewal)
    }

    /// The ownership `identity` holds on `key` through live guards.
    pub(crate) fn held(&self, key: &str, identity: &Arc<str>) -> Option<Held> {
        let entries = self.entries.lock();
        let entry = entries.get(&(key.to_owned(), Arc::clone(identity)))?;
        Some(Held {
            fence: entry.fence,
            guards: entry.guards,
            mode: entry.mode,
        })
    }

    /// Forgets one guard of the ownership whose status is `status` and
    /// returns how many are left; the last guard removes the entry, so the
    /// watchdog never renews it again. `None` when the ownership is no
    /// longer recorded (it was lost).
    ///
    /// Called before the release script is sent, so that the watchdog stops
    /// renewing. A renewal already in flight may still reach Redis after the
    /// release; it changes nothing there, because the renewal script checks
    /// the owner and the fencing token and never re-creates a lock.
    pub(crate) fn leave(
        &self,
        key: &str,
        identity: &Arc<str>,
        status: &Arc<LeaseStatus>,
    ) -> Option<usize> {
        let mut entries = self.entries.lock();
        let key = (key.to_owned(), Arc::clone(identity));
        let entry = entries
            .get_mut(&key)
            .filter(|entry| Arc::ptr_eq(&entry.status, status))?;
        entry.guards -= 1;
        let left = entry.guards;
        if left == 0 {
            entries.remove(&key);
        }
        Some(left)
    }

    /// Removes the ownership of `status` (it was found lost).
    pub(crate) fn forget(&self, key: &str, identity: &Arc<str>, status: &Arc<LeaseStatus>) {
        let mut entries = self.entries.lock();
        let key = (key.to_owned(), Arc::clone(identity));
        if entries
            .get(&key)
            .is_some_and(|entry| Arc::ptr_eq(&entry.status, status))
        {
            entries.remove(&key);
        }
    }

    /// When the watchdog should next renew, if anything is renewed.
    pub(crate) fn next_renewal(&self) -> Option<Instant> {
        self.entries
            .lock()
            .values()
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
        due.sort_by(|a, b| a.key.cmp(&b.key));
        due
    }

    /// Applies `update` to the renewal of `due`'s ownership if it is still
    /// in the table (its guards may have released it meanwhile); removes it
    /// when the update marked it lost. Marked, not merely out of time by
    /// now: a renewal that failed just before the lease's end is tried
    /// again, and that round marks it lost and tells its loss signal and
    /// the event hook (forgetting it here would tell nobody).
    pub(crate) fn update_renewal(&self, due: &DueRenewal, update: impl FnOnce(&mut Renewal)) {
        let mut entries = self.entries.lock();
        let Some(entry) = entries
            .get_mut(&due.key)
            .filter(|entry| Arc::ptr_eq(&entry.status, &due.status))
        else {
            return;
        };
        if let Some(renewal) = entry.renewal.as_mut() {
            update(renewal);
        }
        if entry.status.is_marked_lost() {
            entries.remove(&due.key);
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

    #[test]
    fn reentry_shares_one_entry_and_the_last_guard_removes_it() {
        let ownerships = Ownerships::default();
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let (a, _, wake_a) = ownerships.enter(&keys, &id, 7, mode, now);
        let (b, _, wake_b) = ownerships.enter(&keys, &id, 7, mode, now);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(wake_a.is_some() && wake_b.is_none(), "one watchdog entry");
        assert_eq!(
            ownerships.held(&keys.key, &id),
            Some(Held {
                fence: 7,
                guards: 2,
                mode
            })
        );
        assert_eq!(ownerships.leave(&keys.key, &id, &a), Some(1));
        assert_eq!(ownerships.leave(&keys.key, &id, &b), Some(0));
        assert_eq!(ownerships.held(&keys.key, &id), None);
    }

    #[test]
    fn a_fresh_ownership_marks_the_old_one_lost_and_old_guards_cannot_remove_it() {
        let ownerships = Ownerships::default();
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let (old, _, _) = ownerships.enter(&keys, &id, 1, mode, now);
        let (new, _, _) = ownerships.enter(&keys, &id, 2, mode, now);
        assert!(old.is_lost() && !new.is_lost());
        assert_eq!(ownerships.leave(&keys.key, &id, &old), None);
        assert_eq!(
            ownerships
                .held(&keys.key, &id)
                .map(|held| (held.fence, held.guards)),
            Some((2, 1)),
            "the new ownership stays"
        );
    }

    #[test]
    fn a_lease_is_lost_when_it_ends_by_the_local_clock_unless_it_moved_out() {
        let ownerships = Ownerships::default();
        let (keys, id) = (keys(), Arc::from("me"));
        let long_ago = Instant::now() - Duration::from_secs(2);
        let (status, _, wake) = ownerships.enter(
            &keys,
            &id,
            1,
            LeaseMode::Fixed(Duration::from_secs(1)),
            long_ago,
        );
        assert!(wake.is_none());
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
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let renewed = LeaseMode::Renewed(Duration::from_secs(30));
        let short = LeaseMode::Fixed(Duration::from_millis(200));
        let (outer, outer_mode, _) = ownerships.enter(&keys, &id, 1, renewed, now);
        let (inner, inner_mode, wake) = ownerships.enter(&keys, &id, 1, short, now);
        assert!(Arc::ptr_eq(&outer, &inner));
        assert_eq!((outer_mode, inner_mode), (renewed, renewed));
        assert!(wake.is_none(), "already renewed");
        let later = now + Duration::from_secs(1);
        assert!(!inner.is_lost(), "the 200 ms re-entry did not shorten it");
        assert!(inner.valid_until() >= now + Duration::from_secs(30));
        assert_eq!(
            ownerships
                .due_renewals(later + Duration::from_secs(30))
                .len(),
            1
        );

        // And the other way round: a fixed ownership stays fixed.
        let other = Arc::from("other");
        let (_, first, _) = ownerships.enter(&keys, &other, 2, short, now);
        let (_, again, wake) = ownerships.enter(&keys, &other, 2, renewed, now);
        assert_eq!((first, again, wake), (short, short, None));
    }
}

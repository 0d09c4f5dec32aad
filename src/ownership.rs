//! The ownerships this client holds: one entry per (lock, thread identity),
//! shared by the guards of that thread (re-entry), with the state the
//! watchdog renews and the guards read.

use std::collections::hash_map::{Entry as Slot, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use crate::keys::LockKeys;

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
    lost: AtomicBool,
    /// For fixed leases: when the lease ends at the latest, by this
    /// process's clock (measured from before the request was sent, so never
    /// later than Redis's own expiry). `None` while the watchdog renews.
    fixed_until: Mutex<Option<Instant>>,
}

impl LeaseStatus {
    /// Whether the ownership is known to be gone.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
            || self
                .fixed_until
                .lock()
                .is_some_and(|until| Instant::now() >= until)
    }

    /// Records that the ownership is gone; true the first time.
    pub(crate) fn mark_lost(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }

    /// A fixed lease was set or pushed out, from a request sent at `sent`.
    pub(crate) fn fixed_lease_from(&self, sent: Instant, lease: Duration) {
        let mut until = self.fixed_until.lock();
        if until.is_some() {
            *until = Some(sent + lease);
        }
    }
}

/// One ownership: a lock held by one identity under one fencing token.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) identity: Arc<str>,
    pub(crate) fence: u64,
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
    /// When the lease ends if no renewal succeeds from now on.
    pub(crate) lease_ends: Instant,
}

impl Renewal {
    fn new(lease: Duration, sent: Instant) -> Self {
        Renewal {
            lease,
            due: sent + lease / 3,
            lease_ends: sent + lease,
        }
    }
}

type OwnershipKey = (String, Arc<str>);

/// All ownerships of one client.
#[derive(Debug, Default)]
pub(crate) struct Ownerships {
    entries: Mutex<HashMap<OwnershipKey, Entry>>,
}

impl Ownerships {
    /// Records a guard of the ownership `fence` of `keys` by `identity`,
    /// whose acquisition was sent at `sent`. Returns the shared status and
    /// whether the watchdog has a new ownership to renew.
    pub(crate) fn enter(
        &self,
        keys: &Arc<LockKeys>,
        identity: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> (Arc<LeaseStatus>, bool) {
        let fresh = || Entry {
            keys: Arc::clone(keys),
            identity: Arc::clone(identity),
            fence,
            guards: 0,
            renewal: None,
            status: Arc::new(LeaseStatus {
                lost: AtomicBool::new(false),
                fixed_until: Mutex::new(match mode {
                    LeaseMode::Fixed(lease) => Some(sent + lease),
                    LeaseMode::Renewed(_) => None,
                }),
            }),
        };
        let mut entries = self.entries.lock();
        let entry = match entries.entry((keys.lock.clone(), Arc::clone(identity))) {
            Slot::Occupied(slot) if slot.get().fence == fence => slot.into_mut(),
            Slot::Occupied(mut slot) => {
                // The same thread took the lock afresh: the ownership its
                // older guards belong to is gone.
                slot.get().status.mark_lost();
                slot.insert(fresh());
                slot.into_mut()
            }
            Slot::Vacant(slot) => slot.insert(fresh()),
        };
        entry.guards += 1;
        let mut wake_watchdog = false;
        match mode {
            LeaseMode::Renewed(lease) if entry.renewal.is_none() => {
                entry.renewal = Some(Renewal::new(lease, sent));
                *entry.status.fixed_until.lock() = None;
                wake_watchdog = true;
            }
            LeaseMode::Fixed(lease) => entry.status.fixed_lease_from(sent, lease),
            LeaseMode::Renewed(_) => {}
        }
        (Arc::clone(&entry.status), wake_watchdog)
    }

    /// The ownership `identity` holds on `keys` through live guards: its
    /// fencing token and how many guards it has.
    pub(crate) fn held(&self, keys: &LockKeys, identity: &Arc<str>) -> Option<(u64, usize)> {
        let entries = self.entries.lock();
        let entry = entries.get(&(keys.lock.clone(), Arc::clone(identity)))?;
        Some((entry.fence, entry.guards))
    }

    /// Forgets one guard of the ownership whose status is `status` and
    /// returns how many are left; the last guard removes the entry, so the
    /// watchdog never renews it again. `None` when the ownership is no
    /// longer recorded (it was lost).
    ///
    /// Called before the release script is sent. Waits for a renewal round
    /// in progress (the watchdog holds the entries while it talks to Redis),
    /// so no renewal can arrive after the release.
    pub(crate) fn leave(
        &self,
        keys: &LockKeys,
        identity: &Arc<str>,
        status: &Arc<LeaseStatus>,
    ) -> Option<usize> {
        let mut entries = self.entries.lock();
        let key = (keys.lock.clone(), Arc::clone(identity));
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
    pub(crate) fn forget(&self, keys: &LockKeys, identity: &Arc<str>, status: &Arc<LeaseStatus>) {
        let mut entries = self.entries.lock();
        let key = (keys.lock.clone(), Arc::clone(identity));
        if entries
            .get(&key)
            .is_some_and(|entry| Arc::ptr_eq(&entry.status, status))
        {
            entries.remove(&key);
        }
    }

    /// The entries, locked: for the watchdog's renewal round.
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<OwnershipKey, Entry>> {
        self.entries.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Arc<LockKeys> {
        Arc::new(LockKeys::new("p", "n").unwrap())
    }

    #[test]
    fn reentry_shares_one_entry_and_the_last_guard_removes_it() {
        let ownerships = Ownerships::default();
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let (a, wake_a) = ownerships.enter(&keys, &id, 7, mode, now);
        let (b, wake_b) = ownerships.enter(&keys, &id, 7, mode, now);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(wake_a && !wake_b, "one watchdog entry");
        assert_eq!(ownerships.held(&keys, &id), Some((7, 2)));
        assert_eq!(ownerships.leave(&keys, &id, &a), Some(1));
        assert_eq!(ownerships.leave(&keys, &id, &b), Some(0));
        assert_eq!(ownerships.held(&keys, &id), None);
    }

    #[test]
    fn a_fresh_ownership_marks_the_old_one_lost_and_old_guards_cannot_remove_it() {
        let ownerships = Ownerships::default();
        let (keys, id, now) = (keys(), Arc::from("me"), Instant::now());
        let mode = LeaseMode::Renewed(Duration::from_secs(30));
        let (old, _) = ownerships.enter(&keys, &id, 1, mode, now);
        let (new, _) = ownerships.enter(&keys, &id, 2, mode, now);
        assert!(old.is_lost() && !new.is_lost());
        assert_eq!(ownerships.leave(&keys, &id, &old), None);
        assert_eq!(
            ownerships.held(&keys, &id),
            Some((2, 1)),
            "the new ownership stays"
        );
    }

    #[test]
    fn a_fixed_lease_is_lost_when_it_ends_by_the_local_clock() {
        let ownerships = Ownerships::default();
        let (keys, id) = (keys(), Arc::from("me"));
        let long_ago = Instant::now() - Duration::from_secs(2);
        let (status, wake) = ownerships.enter(
            &keys,
            &id,
            1,
            LeaseMode::Fixed(Duration::from_secs(1)),
            long_ago,
        );
        assert!(!wake);
        assert!(status.is_lost());
        status.fixed_lease_from(Instant::now(), Duration::from_secs(60));
        assert!(!status.is_lost(), "extended");
    }
}

//! Thread identities: who owns a lock.
//!
//! One identity per (OS thread, client): `<instance uuid>:<n>`, where `n`
//! comes from a Redis `INCR` on the prefix's counter key. The uuid is drawn
//! fresh for every client, so identities of different clients never collide
//! even if Redis loses the counter; within one client, `n` never repeats
//! because a counter that went backwards (Redis restarted empty) is skipped
//! past the highest number this client has handed out. The first lock call of
//! a thread pays one `INCR`; later calls read a thread-local.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use uuid::Uuid;

use crate::error::Error;

/// Issues identities for one client.
#[derive(Debug)]
pub(crate) struct Identities {
    instance: Uuid,
    counter_key: String,
    highest_issued: Mutex<u64>,
    /// Lets thread-local entries tell that their client is gone.
    alive: Arc<()>,
}

/// This thread's identity under one client.
struct Cached {
    instance: Uuid,
    client_alive: Weak<()>,
    identity: Arc<str>,
}

thread_local! {
    /// This thread's identity under each client it has used. Entries of
    /// dropped clients are pruned when a new one is added.
    static THREAD_IDENTITIES: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

impl Identities {
    /// The identities of the client `instance` (its random id), numbered
    /// by the counter at `counter_key`.
    pub(crate) fn new(counter_key: String, instance: Uuid) -> Self {
        Identities {
            instance,
            counter_key,
            highest_issued: Mutex::new(0),
            alive: Arc::new(()),
        }
    }

    /// The random id of this client instance.
    pub(crate) fn instance(&self) -> Uuid {
        self.instance
    }

    /// The calling thread's identity under this client, if it has one
    /// already. No network call.
    pub(crate) fn cached(&self) -> Option<Arc<str>> {
        THREAD_IDENTITIES.with_borrow(|ids| {
            ids.iter()
                .find(|cached| cached.instance == self.instance)
                .map(|cached| Arc::clone(&cached.identity))
        })
    }

    /// The calling thread's identity, asking `incr` for a number the first
    /// time this thread asks this client.
    pub(crate) fn current(
        &self,
        incr: impl FnOnce(&str) -> Result<u64, Error>,
    ) -> Result<Arc<str>, Error> {
        if let Some(id) = self.cached() {
            return Ok(id);
        }
        let counted = incr(&self.counter_key)?;
        let number = {
            let mut highest = self.highest_issued.lock();
            *highest = counted.max(*highest + 1);
            *highest
        };
        let id: Arc<str> = format!("{}:{number}", self.instance).into();
        THREAD_IDENTITIES.with_borrow_mut(|ids| {
            ids.retain(|cached| cached.client_alive.strong_count() > 0);
            ids.push(Cached {
                instance: self.instance,
                client_alive: Arc::downgrade(&self.alive),
                identity: Arc::clone(&id),
            });
        });
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_counter_call_per_thread_and_unique_after_counter_reset() {
        let ids = Identities::new("c".into(), Uuid::new_v4());
        let mut calls = 0;
        let first = ids
            .current(|_| {
                calls += 1;
                Ok(7)
            })
            .unwrap();
        let again = ids.current(|_| unreachable!("cached")).unwrap();
        assert_eq!(first, again);
        assert_eq!(calls, 1);

        // Another thread after the counter went back to 1 (Redis lost it).
        let other =
            std::thread::scope(|s| s.spawn(|| ids.current(|_| Ok(1)).unwrap()).join().unwrap());
        assert_ne!(first, other);
        assert!(other.ends_with(":8"), "{other}");
    }

    #[test]
    fn dropped_clients_are_pruned_from_the_thread_cache() {
        for _ in 0..10 {
            let ids = Identities::new("c".into(), Uuid::new_v4());
            ids.current(|_| Ok(1)).unwrap();
        }
        let live = Identities::new("c".into(), Uuid::new_v4());
        live.current(|_| Ok(1)).unwrap();
        THREAD_IDENTITIES.with_borrow(|v| assert_eq!(v.len(), 1));
    }
}

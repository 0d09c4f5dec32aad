//! The lock's behaviour on every topology (one server, a cluster, a
//! sentinel-watched master): the same test bodies, run once per topology by
//! `across_topologies!`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::support::{eventually, lock_key, parked, JoinWithin};

/// Names whose slots fall on every master of a three-master cluster, and
/// the awkward ones: braces, `}{`, emoji, NUL.
const NAMES: &[&str] = &[
    "orders",
    "invoices",
    "a",
    "b",
    "c",
    "d",
    "e",
    "{x}",
    "}{",
    "🦀 lock",
    "nul\0name",
];

across_topologies! {
    /// Threads of two clients take turns on every name; no two hold one
    /// name at once, and every acquisition is counted.
    fn threads_of_two_clients_exclude_each_other_on_every_name(deployment) {
        let clients = [deployment.client(), deployment.client()];
        const ROUNDS: usize = 10;
        for name in NAMES {
            let inside = Arc::new(AtomicUsize::new(0));
            let entries = Arc::new(AtomicUsize::new(0));
            let workers: Vec<_> = (0..4)
                .map(|i| {
                    let lock = clients[i % 2].lock(name).unwrap();
                    let (inside, entries) = (Arc::clone(&inside), Arc::clone(&entries));
                    thread::spawn(move || {
                        for _ in 0..ROUNDS {
                            let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders of {name:?}");
                            thread::sleep(Duration::from_millis(1));
                            inside.fetch_sub(1, Ordering::SeqCst);
                            entries.fetch_add(1, Ordering::SeqCst);
                            guard.unlock().unwrap();
                        }
                    })
                })
                .collect();
            for worker in workers {
                worker.joined();
            }
            assert_eq!(entries.load(Ordering::SeqCst), 4 * ROUNDS, "acquisitions of {name:?}");
            // The lock lives where the deployment says its slot is (on a
            // cluster: the master CLUSTER KEYSLOT names).
            let mut raw = deployment.server_for(&lock_key(name)).connection();
            let exists = |raw: &mut redis::Connection| -> bool {
                redis::cmd("EXISTS").arg(lock_key(name)).query(raw).unwrap()
            };
            assert!(!exists(&mut raw), "{name:?} released");
            let guard = clients[0].lock(name).unwrap().lock().unwrap();
            assert!(exists(&mut raw), "{name:?} held on the node serving its slot");
            guard.unlock().unwrap();
        }
    }
}

across_topologies! {
    /// A waiter parked behind a holder is woken by the release well before
    /// its park would end.
    fn a_release_wakes_a_parked_waiter(deployment) {
        let (holder, waiter) = (deployment.client(), deployment.builder().max_park(Duration::from_secs(10)).build().unwrap());
        let guard = holder.lock("baton").unwrap().lock().unwrap();
        let lock = waiter.lock("baton").unwrap();
        let handle = thread::spawn(move || {
            let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap().expect("acquired");
            let at = Instant::now();
            guard.unlock().unwrap();
            at
        });
        // Parked on the server of its slot (on one master of a quorum).
        eventually(Duration::from_secs(10), "the waiter parks", || {
            deployment.servers_for(&lock_key("baton")).into_iter().map(parked).sum::<u64>() == 1
        });
        let released_at = Instant::now();
        guard.unlock().unwrap();
        let at = handle.joined();
        assert!(at >= released_at, "acquired before the release");
        let late = at - released_at;
        assert!(late < Duration::from_secs(2), "woken by the baton, not the park's end: {late:?}");
    }
}

across_topologies! {
    /// `Client::lock_names` finds every held lock wherever its slot lives
    /// (on a cluster, the names fall on every master), each once and by
    /// the name it was given, and nothing of other kinds or once freed.
    fn lock_names_lists_the_held_locks_of_every_master(deployment) {
        let client = deployment.client();
        let guards: Vec<_> = NAMES
            .iter()
            .map(|name| client.lock(name).unwrap().lock().unwrap())
            .collect();
        let mut expected: Vec<String> = NAMES.iter().map(|name| (*name).to_owned()).collect();
        expected.sort();
        // A fair lock and a semaphore's permit are no plain locks.
        if !deployment.is_quorum() {
            let _fair = client.fair_lock("fair only").unwrap().lock().unwrap();
            let semaphore = client.semaphore("orders").unwrap();
            semaphore.try_set_permits(1).unwrap();
            let _permit = semaphore.acquire().unwrap();
            assert_eq!(client.lock_names("*").unwrap(), expected);
        }
        assert_eq!(client.lock_names("*").unwrap(), expected);
        // The glob is over names: a literal brace matches a brace.
        assert_eq!(client.lock_names("{x}").unwrap(), ["{x}"]);
        assert_eq!(client.lock_names("?").unwrap(), ["a", "b", "c", "d", "e"]);
        assert_eq!(client.lock_names("nothing*").unwrap(), Vec::<String>::new());
        // Another prefix is another application's.
        let other = deployment.builder().prefix("other").build().unwrap();
        assert_eq!(other.lock_names("*").unwrap(), Vec::<String>::new());
        for guard in guards {
            guard.unlock().unwrap();
        }
        assert_eq!(client.lock_names("*").unwrap(), Vec::<String>::new());
    }
}

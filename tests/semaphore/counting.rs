//! Counting: the total in Redis (first writer wins, added to, reduced),
//! what acquisitions take and releases give back, and what is available.

use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::sem_keys;
use crate::support::JoinWithin;

across_topologies! { but_masters;
    /// The first try_set_permits writes the total; later ones return it
    /// unchanged; add and reduce move it, never below zero.
    fn the_first_writer_sets_the_total_and_add_and_reduce_move_it(deployment) {
        let (a, b) = (deployment.client(), deployment.client());
        let sem = a.semaphore("pool").unwrap();
        assert_eq!(sem.try_set_permits(3).unwrap(), 3);
        assert_eq!(b.semaphore("pool").unwrap().try_set_permits(10).unwrap(), 3, "first writer wins");
        assert_eq!(sem.total_permits().unwrap(), 3);
        assert_eq!(sem.add_permits(2).unwrap(), 5);
        assert_eq!(sem.available_permits().unwrap(), 5);
        assert_eq!(sem.reduce_permits(1).unwrap(), 4);
        assert_eq!(sem.reduce_permits(100).unwrap(), 0, "never below zero");
        assert_eq!(sem.available_permits().unwrap(), 0);
        assert_eq!(sem.add_permits(1).unwrap(), 1);
        assert_eq!(b.semaphore("pool").unwrap().total_permits().unwrap(), 1);
    }
}

across_topologies! { but_masters;
    /// Acquisitions take permits (one guard may hold several), releases
    /// and drops give them back, and try_acquire says None, without
    /// waiting, when too few are left.
    fn acquisitions_take_permits_and_releases_give_them_back(deployment) {
        let client = deployment.client();
        let sem = client.semaphore("counted").unwrap();
        sem.try_set_permits(3).unwrap();
        let one = sem.acquire().unwrap();
        let two = sem.acquire_many(2).unwrap();
        assert_eq!((one.num_permits(), two.num_permits()), (1, 2));
        assert_eq!(sem.available_permits().unwrap(), 0);
        let started = Instant::now();
        assert!(sem.try_acquire().unwrap().is_none());
        assert!(sem.try_acquire_many(3).unwrap().is_none());
        assert!(started.elapsed() < Duration::from_secs(1), "try_acquire never waits");
        two.release().unwrap();
        assert_eq!(sem.available_permits().unwrap(), 2);
        assert!(sem.try_acquire_many(3).unwrap().is_none(), "two of three are free");
        let again = sem.try_acquire_many(2).unwrap().expect("two are free");
        drop(again);
        drop(one);
        assert_eq!(sem.available_permits().unwrap(), 3);
        // Nothing is left of the holders once all have released.
        let [_, holders, counts, ..] = sem_keys("counted");
        let node = deployment.server_for(&holders);
        let mut raw = node.connection();
        let left: u32 = redis::cmd("EXISTS").arg(&holders).arg(&counts).query(&mut raw).unwrap();
        assert_eq!(left, 0, "no holder left behind");
    }
}

across_topologies! { but_masters;
    /// A waiter gives up at its deadline with None, and leaves no place
    /// behind; a release wakes the next waiter well before its park ends.
    fn a_waiter_times_out_then_a_release_wakes_the_next(deployment) {
        let holder = deployment.client();
        let waiter = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let sem = holder.semaphore("one").unwrap();
        sem.try_set_permits(1).unwrap();
        let held = sem.acquire().unwrap();
        let waiting = waiter.semaphore("one").unwrap();
        let started = Instant::now();
        assert!(waiting.try_acquire_for(Duration::from_millis(300)).unwrap().is_none());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(2), "{waited:?}");
        let [_, _, _, waiters, ..] = sem_keys("one");
        let mut raw = deployment.server_for(&waiters).connection();
        let places: u32 = redis::cmd("ZCARD").arg(&waiters).query(&mut raw).unwrap();
        assert_eq!(places, 0, "a waiter that gave up left its place");

        let started = Instant::now();
        let handle = thread::spawn(move || {
            let permit = waiting.try_acquire_for(Duration::from_secs(20)).unwrap().expect("woken");
            let waited = started.elapsed();
            permit.release().unwrap();
            waited
        });
        thread::sleep(Duration::from_millis(300));
        held.release().unwrap();
        let waited = handle.joined();
        assert!(waited >= Duration::from_millis(300), "not before the release: {waited:?}");
        assert!(waited < Duration::from_secs(3), "woken by the release, not the park's end: {waited:?}");
    }
}

across_topologies! { but_masters;
    /// Reduced below what is held: nothing is available until enough
    /// holders release, and available never exceeds the total.
    fn a_reduction_below_what_is_held_leaves_nothing_available_until_holders_release(deployment) {
        let client = deployment.client();
        let sem = client.semaphore("shrinking").unwrap();
        sem.try_set_permits(3).unwrap();
        let permits: Vec<_> = (0..3).map(|_| sem.acquire().unwrap()).collect();
        assert_eq!(sem.reduce_permits(2).unwrap(), 1);
        let mut seen = Vec::new();
        for permit in permits {
            let available = sem.available_permits().unwrap();
            seen.push(available);
            if available == 0 {
                assert!(sem.try_acquire().unwrap().is_none(), "none available, none granted");
            }
            permit.release().unwrap();
        }
        seen.push(sem.available_permits().unwrap());
        assert_eq!(seen, [0, 0, 0, 1], "available before each release and after the last");
        let err = sem.try_acquire_many(2).unwrap_err();
        assert!(matches!(err, redbaton::Error::PermitsOverCapacity { capacity: 1, permits: 2, .. }), "{err}");
    }
}

/// The scripts are sent by hash: after SCRIPT FLUSH they are loaded again,
/// for calls and for the watchdog's pipelined renewals alike.
#[test]
fn every_call_works_after_script_flush() {
    let server = testkit::RedisServer::start();
    let client = redbaton::Client::builder(server.url())
        // Long enough that a renewal delayed by a loaded machine does
        // not lose the permit (300 ms did, now and then), short enough
        // that several renewals run after the flush.
        .default_lease(Duration::from_millis(1000))
        .build()
        .unwrap();
    let sem = client.semaphore("flushed").unwrap();
    let mut raw = server.connection();
    let flush =
        |raw: &mut redis::Connection| redis::cmd("SCRIPT").arg("FLUSH").query::<()>(raw).unwrap();
    flush(&mut raw);
    sem.try_set_permits(2).unwrap();
    flush(&mut raw);
    let permit = sem.acquire().unwrap();
    flush(&mut raw);
    // Renewals every third of a second find the script gone and load it
    // again: without that the permit is lost by the end of this sleep.
    thread::sleep(Duration::from_millis(1500));
    assert!(!permit.is_lost());
    flush(&mut raw);
    assert_eq!(sem.available_permits().unwrap(), 1);
    flush(&mut raw);
    assert_eq!(sem.add_permits(1).unwrap(), 3);
    flush(&mut raw);
    permit.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 3);
}

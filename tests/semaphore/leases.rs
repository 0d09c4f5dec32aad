//! Leases: renewed permits outlive their lease while their guard lives;
//! fixed ones return on time, and their late release is reported, never
//! counted twice.

use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use redbaton::Error;

across_topologies! { but_masters;
    /// With a 300 ms lease, a held permit outlives five leases: another
    /// client never gets it meanwhile, and the guard is not lost.
    fn a_renewed_permit_outlives_its_lease_while_its_guard_lives(deployment) {
        let lease = Duration::from_millis(300);
        let holder = deployment.builder().default_lease(lease).build().unwrap();
        let other = deployment.client();
        let sem = holder.semaphore("renewed").unwrap();
        sem.try_set_permits(1).unwrap();
        let permit = sem.acquire().unwrap();
        let acquired = Instant::now();
        let elsewhere = other.semaphore("renewed").unwrap();
        while acquired.elapsed() < 5 * lease {
            assert!(elsewhere.try_acquire().unwrap().is_none(), "taken after {:?}", acquired.elapsed());
            assert_eq!(elsewhere.available_permits().unwrap(), 0);
            assert!(!permit.is_lost());
            thread::sleep(Duration::from_millis(50));
        }
        assert!(permit.valid_until() > Instant::now());
        assert!(holder.watchdog_stats().renewals >= 3, "{:?}", holder.watchdog_stats());
        permit.release().unwrap();
        assert!(elsewhere.try_acquire().unwrap().is_some());
    }
}

across_topologies! { but_masters;
    /// A fixed-lease permit returns to the semaphore when its lease ends:
    /// another takes it, the old guard reports lost, and its late release
    /// is PermitsLost and gives nothing back a second time.
    fn releasing_an_expired_permit_is_reported_and_never_counted_twice(deployment) {
        let client = deployment.client();
        let sem = client.semaphore("expiring").unwrap();
        sem.try_set_permits(2).unwrap();
        let short = sem.with_fixed_lease(Duration::from_millis(200)).unwrap();
        let expired = short.acquire_many(2).unwrap();
        assert_eq!(sem.available_permits().unwrap(), 0);
        thread::sleep(Duration::from_millis(400));
        assert!(expired.is_lost());
        assert_eq!(sem.available_permits().unwrap(), 2, "returned when the lease ended");
        let newer = sem.acquire().unwrap();
        let err = expired.release().unwrap_err();
        assert!(matches!(err, Error::PermitsLost { permits: 2, ref name } if name == "expiring"), "{err}");
        assert_eq!(sem.available_permits().unwrap(), 1, "the newer holder's permit still counts");
        newer.release().unwrap();
        assert_eq!(sem.available_permits().unwrap(), 2, "never above the total");
        assert_eq!(sem.total_permits().unwrap(), 2);
    }
}

across_topologies! { but_masters;
    /// Dropping an expired permit logs instead of failing, and changes
    /// nothing either.
    fn dropping_an_expired_permit_gives_nothing_back(deployment) {
        let client = deployment.client();
        let sem = client.semaphore("dropped").unwrap();
        sem.try_set_permits(1).unwrap();
        let expired = sem.with_fixed_lease(Duration::from_millis(100)).unwrap().acquire().unwrap();
        thread::sleep(Duration::from_millis(250));
        let newer = sem.try_acquire().unwrap().expect("the lease ended");
        drop(expired);
        assert_eq!(sem.available_permits().unwrap(), 0);
        drop(newer);
        assert_eq!(sem.available_permits().unwrap(), 1);
    }
}

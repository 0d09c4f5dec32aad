//! `ClientBuilder::metrics`: what the `metrics` facade is told after known
//! sequences, read from `metrics-util`'s debugging recorder installed for
//! the test's threads only (`with_local_recorder`), so that tests running
//! at once do not see each other's metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use metrics::{with_local_recorder, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redbaton::Client;
use testkit::RedisServer;

use crate::support::{eventually, lock_key, parked};

/// A metric's value so far.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Counter(u64),
    Gauge(f64),
    /// The samples recorded, in seconds.
    Histogram(Vec<f64>),
}

/// A recorder for the test's threads, and what it recorded so far (each
/// snapshot takes the counters' and gauges' increments since the last).
struct Recorded {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
    /// By `metric{label=value,...}`, the labels sorted.
    values: Mutex<BTreeMap<String, Value>>,
    units: Mutex<BTreeMap<String, Unit>>,
}

impl Recorded {
    fn new() -> Self {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        Recorded {
            recorder,
            snapshotter,
            values: Mutex::default(),
            units: Mutex::default(),
        }
    }

    /// Runs `f` on this thread with the recorder.
    fn on<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(&self.recorder, f)
    }

    /// Everything recorded so far.
    fn values(&self) -> BTreeMap<String, Value> {
        let mut values = self.values.lock().unwrap();
        for (key, unit, _, value) in self.snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Vec<String> = key
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            labels.sort();
            let id = format!("{}{{{}}}", key.name(), labels.join(","));
            if let Some(unit) = unit {
                let mut units = self.units.lock().unwrap();
                units.insert(key.name().to_owned(), unit);
            }
            let entry = values.entry(id);
            match value {
                DebugValue::Counter(n) => {
                    let old = match entry.or_insert(Value::Counter(0)) {
                        Value::Counter(old) => old,
                        other => panic!("not a counter: {other:?}"),
                    };
                    *old += n;
                }
                // A snapshot takes a gauge's value too (leaving 0): the
                // increments since the last.
                DebugValue::Gauge(g) => {
                    let old = match entry.or_insert(Value::Gauge(0.0)) {
                        Value::Gauge(old) => old,
                        other => panic!("not a gauge: {other:?}"),
                    };
                    *old += g.into_inner();
                }
                DebugValue::Histogram(samples) => {
                    let old = match entry.or_insert(Value::Histogram(Vec::new())) {
                        Value::Histogram(old) => old,
                        other => panic!("not a histogram: {other:?}"),
                    };
                    old.extend(samples.into_iter().map(|s| s.into_inner()));
                }
            }
        }
        values.clone()
    }

    /// The unit `metric` was described with.
    fn unit(&self, metric: &str) -> Option<Unit> {
        self.values();
        self.units.lock().unwrap().get(metric).copied()
    }

    /// The samples of histogram `id`.
    fn samples(&self, id: &str) -> Vec<f64> {
        match self.values().get(id) {
            Some(Value::Histogram(samples)) => samples.clone(),
            other => panic!("{id} is {other:?}"),
        }
    }
}

fn metered(server: &RedisServer, names_as_labels: bool) -> Client {
    Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .metrics(names_as_labels)
        .build()
        .unwrap()
}

/// The ids of `values`, with what each counter or gauge holds (a
/// histogram as its number of samples).
fn summary(values: &BTreeMap<String, Value>) -> Vec<(String, f64)> {
    values
        .iter()
        .map(|(id, value)| {
            let figure = match value {
                Value::Counter(n) => *n as f64,
                Value::Gauge(g) => *g,
                Value::Histogram(samples) => samples.len() as f64,
            };
            (id.clone(), figure)
        })
        .collect()
}

fn expected(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
    let mut pairs: Vec<(String, f64)> = pairs.iter().map(|(id, n)| (id.to_string(), *n)).collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
}

#[test]
fn an_uncontended_cycle_counts_one_acquisition_and_times_it() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    recorded.on(|| {
        let client = metered(&server, false);
        let guard = client.lock("plain").unwrap().lock().unwrap();
        guard.unlock().unwrap();
    });
    let values = recorded.values();
    assert_eq!(
        summary(&values),
        expected(&[
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=lock}",
                1.0
            ),
            ("redbaton_held{kind=lock}", 0.0),
            ("redbaton_hold_seconds{kind=lock}", 1.0),
            ("redbaton_wait_seconds{kind=lock}", 1.0),
        ])
    );
    let waited = recorded.samples("redbaton_wait_seconds{kind=lock}")[0];
    assert!((0.0..2.0).contains(&waited), "{waited}");
    assert_eq!(recorded.unit("redbaton_wait_seconds"), Some(Unit::Seconds));
    assert_eq!(
        recorded.unit("redbaton_acquisitions_total"),
        Some(Unit::Count)
    );
}

#[test]
fn the_name_is_a_label_only_when_asked_for() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    recorded.on(|| {
        let client = metered(&server, true);
        let guard = client.lock("named").unwrap().lock().unwrap();
        guard.unlock().unwrap();
        let semaphore = client.semaphore("pool").unwrap();
        semaphore.try_set_permits(2).unwrap();
        semaphore.acquire().unwrap().release().unwrap();
    });
    assert_eq!(
        summary(&recorded.values()),
        expected(&[
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=lock,name=named}",
                1.0
            ),
            ("redbaton_held{kind=lock,name=named}", 0.0),
            ("redbaton_hold_seconds{kind=lock,name=named}", 1.0),
            ("redbaton_wait_seconds{kind=lock,name=named}", 1.0),
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=permits,name=pool}",
                1.0
            ),
            ("redbaton_held{kind=permits,name=pool}", 0.0),
            ("redbaton_hold_seconds{kind=permits,name=pool}", 1.0),
            ("redbaton_wait_seconds{kind=permits,name=pool}", 1.0),
        ])
    );
}

#[test]
fn a_client_without_metrics_records_nothing() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    recorded.on(|| {
        let client = Client::open(&server.url()).unwrap();
        let guard = client.lock("quiet").unwrap().lock().unwrap();
        guard.unlock().unwrap();
    });
    assert_eq!(recorded.values(), BTreeMap::new());
}

#[test]
fn a_contended_hand_off_counts_a_contended_acquisition_and_a_parked_waiter() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.lock("contended").unwrap().lock().unwrap();
    let client = recorded.on(|| metered(&server, false));
    let lock = client.lock("contended").unwrap();
    thread::scope(|scope| {
        let recorder = &recorded.recorder;
        let waiter = scope.spawn(|| {
            with_local_recorder(recorder, || {
                let guard = lock.lock().unwrap();
                guard.unlock().unwrap();
            })
        });
        eventually(Duration::from_secs(10), "the waiter parked", || {
            parked(&server) == 1
        });
        held.unlock().unwrap();
        waiter.join().unwrap();
    });
    let values = recorded.values();
    assert_eq!(
        summary(&values),
        expected(&[
            (
                "redbaton_acquisitions_total{how=after_waiting,kind=lock}",
                1.0
            ),
            ("redbaton_contended_acquisitions_total{kind=lock}", 1.0),
            ("redbaton_held{kind=lock}", 0.0),
            ("redbaton_hold_seconds{kind=lock}", 1.0),
            ("redbaton_parked_waiters{}", 0.0),
            ("redbaton_wait_seconds{kind=lock}", 1.0),
        ])
    );
    assert!(recorded.samples("redbaton_wait_seconds{kind=lock}")[0] > 0.0);
}

#[test]
fn a_parked_waiter_is_counted_while_it_waits_and_its_timeout_after() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.lock("busy").unwrap().lock().unwrap();
    let client = recorded.on(|| metered(&server, false));
    let lock = client.lock("busy").unwrap();
    thread::scope(|scope| {
        let recorder = &recorded.recorder;
        let waiter = scope.spawn(|| {
            with_local_recorder(recorder, || {
                lock.try_lock_for(Duration::from_secs(30))
                    .unwrap()
                    .is_none()
            })
        });
        eventually(Duration::from_secs(10), "the waiter parked", || {
            parked(&server) == 1
        });
        assert_eq!(
            recorded.values().get("redbaton_parked_waiters{}"),
            Some(&Value::Gauge(1.0))
        );
        let waiter2 = scope.spawn(|| {
            with_local_recorder(recorder, || {
                lock.try_lock_for(Duration::from_millis(300))
                    .unwrap()
                    .is_none()
            })
        });
        assert!(waiter2.join().unwrap(), "timed out");
        held.unlock().unwrap();
        assert!(!waiter.join().unwrap(), "acquired after the release");
    });
    assert_eq!(
        summary(&recorded.values()),
        expected(&[
            (
                "redbaton_acquisitions_total{how=after_waiting,kind=lock}",
                1.0
            ),
            ("redbaton_contended_acquisitions_total{kind=lock}", 1.0),
            ("redbaton_held{kind=lock}", 0.0),
            ("redbaton_hold_seconds{kind=lock}", 1.0),
            ("redbaton_parked_waiters{}", 0.0),
            ("redbaton_timeouts_total{}", 1.0),
            ("redbaton_wait_seconds{kind=lock}", 1.0),
        ])
    );
}

#[test]
fn a_release_that_fails_on_redis_ends_the_hold_and_is_counted() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    recorded.on(|| {
        let client = Client::builder(server.url())
            .io_timeout(Duration::from_millis(300))
            .metrics(false)
            .build()
            .unwrap();
        let guard = client.lock("away").unwrap().lock().unwrap();
        let read = client.rw_lock("rw").unwrap().read().unwrap();
        let semaphore = client.semaphore("pool").unwrap();
        semaphore.try_set_permits(2).unwrap();
        let permit = semaphore.acquire().unwrap();
        server.kill();
        for released in [guard.unlock(), read.unlock(), permit.release()] {
            assert!(
                released.as_ref().is_err_and(|err| !err.is_lost()),
                "{released:?}"
            );
        }
    });
    assert_eq!(
        summary(&recorded.values()),
        expected(&[
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=lock}",
                1.0
            ),
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=permits}",
                1.0
            ),
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=read}",
                1.0
            ),
            ("redbaton_background_releases_total{}", 3.0),
            ("redbaton_held{kind=lock}", 0.0),
            ("redbaton_held{kind=permits}", 0.0),
            ("redbaton_held{kind=read}", 0.0),
            ("redbaton_release_failures_total{kind=lock}", 1.0),
            ("redbaton_release_failures_total{kind=permits}", 1.0),
            ("redbaton_release_failures_total{kind=read}", 1.0),
            ("redbaton_wait_seconds{kind=lock}", 1.0),
            ("redbaton_wait_seconds{kind=permits}", 1.0),
            ("redbaton_wait_seconds{kind=read}", 1.0),
        ])
    );
}

#[test]
fn a_loss_is_counted_with_its_reason_and_ends_the_hold() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    recorded.on(|| {
        let client = metered(&server, false);
        let guard = client.lock("lost").unwrap().lock().unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(lock_key("lost"))
            .query(&mut server.connection())
            .unwrap();
        // Found by the release, on this thread (the watchdog's first
        // renewal is a third of the 30 s lease away).
        assert!(matches!(
            guard.unlock(),
            Err(redbaton::Error::LockLost { .. })
        ));
    });
    assert_eq!(
        summary(&recorded.values()),
        expected(&[
            (
                "redbaton_acquisitions_total{how=first_attempt,kind=lock}",
                1.0
            ),
            ("redbaton_held{kind=lock}", 0.0),
            ("redbaton_losses_total{kind=lock,reason=not_held}", 1.0),
            ("redbaton_wait_seconds{kind=lock}", 1.0),
        ])
    );
}

#[test]
fn an_acquisition_that_fails_is_counted_by_kind() {
    let server = RedisServer::start();
    let recorded = Recorded::new();
    recorded.on(|| {
        let client = metered(&server, false);
        // The keys hold strings: each first attempt fails on the type.
        let mut connection = server.connection();
        let sem = "redbaton:{pool}:sem:state";
        let rw = "redbaton:{table}:rw:write";
        let upgradable = "redbaton:{ledger}:rw:upgradable";
        for key in [
            lock_key("wrong"),
            sem.to_owned(),
            rw.to_owned(),
            upgradable.to_owned(),
        ] {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("x")
                .query(&mut connection)
                .unwrap();
        }
        assert!(client.lock("wrong").unwrap().try_lock().is_err());
        assert!(client.lock("wrong").unwrap().lock().is_err());
        assert!(client.semaphore("pool").unwrap().try_acquire().is_err());
        let table = client.rw_lock("table").unwrap();
        assert!(table.read().is_err());
        assert!(table.try_read().is_err());
        assert!(table.try_write_for(Duration::from_secs(1)).is_err());
        assert!(table.try_write().is_err());
        let ledger = client.rw_lock("ledger").unwrap();
        assert!(ledger.try_upgradable_read().is_err());
        assert!(ledger.upgradable_read().is_err());
        // One failure per name of the set.
        let set = client.multi_lock(["wrong", "fine"]).unwrap();
        assert!(set.try_lock().is_err());
        assert!(set.lock().is_err());
    });
    assert_eq!(
        summary(&recorded.values()),
        expected(&[
            ("redbaton_acquire_failures_total{kind=lock}", 6.0),
            ("redbaton_acquire_failures_total{kind=permits}", 1.0),
            ("redbaton_acquire_failures_total{kind=read}", 2.0),
            ("redbaton_acquire_failures_total{kind=upgradable}", 2.0),
            ("redbaton_acquire_failures_total{kind=write}", 2.0),
        ])
    );
}

//! The driver: one cell of the matrix (a synchronizer, a deployment, an
//! event) run and checked the same way for every kind. Workers in child
//! processes enter and leave for a short while, the event happens in the
//! middle, and the cell checks with figures: exclusion (occupancy marker),
//! how long the synchronizer stayed shut with waiters at its door, the
//! errors' kinds, the waiting cost before, during and after the event, the
//! fair lock's arrival order, the semaphore's total, and that no key is
//! left without a TTL.

use std::thread;
use std::time::{Duration, Instant};

use testkit::RedisServer;

use crate::checks;
use crate::events::{Event, Outcome, Stage, BASE};
use crate::spec::{Deploy, Spec, Sync};
use crate::subject::Handle;
use crate::support::{spawn_child_at, Deployment, JoinWithin, Topology};
use crate::worker::{now_ms, Tally};

/// Worker processes per cell, and threads in each.
const PROCESSES: usize = 2;
const THREADS: usize = 3;
/// The workers' lease: short, so that a lease-long stall is seen, and
/// longer than [`BASE`], so that it is told apart from a park.
const LEASE: Duration = Duration::from_secs(3);
/// How long the workers run before and after the event.
const BEFORE: Duration = Duration::from_millis(800);
const AFTER: Duration = Duration::from_millis(1_200);

/// The window after the event: [`AFTER`], or `MATRIX_AFTER_MS` for a
/// longer, opt-in soak of the same cells.
fn after_window() -> Duration {
    std::env::var("MATRIX_AFTER_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(AFTER, Duration::from_millis)
}

/// Commands per thread per second that no window may exceed: a waiter
/// that parks sends a few per entry (one in a few hundred ms with the
/// cells' 100 ms holds) and two per `max_park`; one that spins, hundreds
/// to thousands.
fn cost_ceiling(max_park: Duration) -> f64 {
    100.0 + 6.0 / max_park.as_secs_f64()
}

/// A started deployment, its witness, and the cell's settings.
pub struct Setup {
    pub deployment: Deployment,
    /// Kept for the cell's life: the occupancy markers and results.
    pub _witness_server: RedisServer,
    /// The workers' spec (through a proxy when the event needs one).
    pub spec: Spec,
    /// The test's own spec, on the deployment directly.
    pub direct: Spec,
    pub proxy: Option<testkit::FaultProxy>,
}

impl Setup {
    fn start(sync: Sync, deploy: Deploy, event: Event) -> Setup {
        let deployment = match deploy {
            Deploy::Single => Deployment::start(Topology::Single),
            Deploy::Cluster => Deployment::start(Topology::Cluster),
            // Two replicas, as a deployment with replica_acks(1) needs: a
            // failover, or a dead master, leaves one to confirm writes.
            Deploy::Sentinel => Deployment::sentinels_with_replicas(2),
            Deploy::Masters => Deployment::start(Topology::Masters),
        };
        let witness_server = RedisServer::start();
        let urls = match deploy {
            Deploy::Single => vec![deployment.server().url()],
            Deploy::Cluster => deployment.cluster().seed_urls(),
            Deploy::Sentinel => deployment.sentinels().sentinel_urls(),
            Deploy::Masters => deployment
                .servers_for("any")
                .into_iter()
                .map(RedisServer::url)
                .collect(),
        };
        let permits = match sync {
            Sync::Semaphore => 2,
            Sync::Rate => 40,
            _ => 1,
        };
        let direct = Spec {
            sync,
            deploy,
            urls,
            witness: witness_server.url(),
            name: "m".into(),
            lease: LEASE,
            max_park: event.max_park(),
            replica_acks: deploy == Deploy::Sentinel,
            threads: THREADS,
            hold: Duration::from_millis(100),
            permits,
            cap: if event == Event::Adjust {
                permits + 1
            } else {
                permits
            },
        };
        let mut spec = direct.clone();
        let proxy = event.proxy(&deployment, &mut spec);
        Setup {
            deployment,
            _witness_server: witness_server,
            spec,
            direct,
            proxy,
        }
    }
}

/// What a cell found wrong, and its figures.
#[derive(Default)]
pub struct Report {
    pub figures: Vec<String>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn figure(&mut self, text: String) {
        self.figures.push(text);
    }

    pub fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(failure());
        }
    }

    /// The errors the workers met: every one must be transient (the
    /// events pass), and a migration is never a wrong topology.
    pub fn errors(&mut self, tally: &Tally) {
        let summary: Vec<String> = tally
            .errors
            .iter()
            .map(|(kind, (count, _, _))| format!("{kind}×{count}"))
            .collect();
        self.figure(format!("errors [{}]", summary.join(" ")));
        for (kind, (count, transient, example)) in &tally.errors {
            self.check(*transient && kind != "WrongTopology", || {
                format!("{count} errors of a wrong kind: {kind}: {example}")
            });
        }
    }

    /// Prints the cell's line and fails the test with every failure.
    pub fn finish(self, cell: &str) {
        eprintln!("MATRIX {cell}: {}", self.figures.join(", "));
        assert!(
            self.failures.is_empty(),
            "cell {cell} failed:\n  {}",
            self.failures.join("\n  ")
        );
    }
}

/// Runs one cell; panics with every failed check.
pub fn run(sync: Sync, deploy: Deploy, event: Event) {
    let cell = format!("{sync:?}/{deploy:?}/{event:?}");
    if let Some(reason) = event.skipped(sync, deploy) {
        panic!("cell {cell} is listed as skipped ({reason}): take it out of the table");
    }
    let started = Instant::now();
    let setup = Setup::start(sync, deploy, event);
    let mut report = if sync == Sync::Latch {
        crate::latch::run(&setup, event)
    } else {
        contend(&setup, event)
    };
    no_key_without_ttl(&setup, &mut report);
    report.figure(format!("cell took {} ms", started.elapsed().as_millis()));
    report.finish(&cell);
}

/// Sets `key` on the witness server.
pub fn set(witness: &mut redis::Connection, key: &str, value: impl redis::ToRedisArgs) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query::<()>(witness)
        .unwrap();
}

/// The shortest window a rate is taken over. An event may take only a few
/// tens of ms (a kill): one attempt per waiter falling into it (a quorum's
/// three scripts each) made a rate over the ceiling once in a few runs,
/// with no spin. A spin, hundreds of commands per thread per second or
/// more, still shows over this, and in the 1.2 s after the event.
const SHORTEST_WINDOW: Duration = Duration::from_millis(250);

/// Commands per thread per second between two snapshots (over at least
/// [`SHORTEST_WINDOW`]).
pub fn cost(
    before: &std::collections::BTreeMap<(u16, String), u64>,
    after: &std::collections::BTreeMap<(u16, String), u64>,
    threads: usize,
    window: Duration,
) -> f64 {
    checks::commands_between(before, after) as f64
        / threads as f64
        / window.max(SHORTEST_WINDOW).as_secs_f64()
}

/// The synchronizers that are entered: workers contend while the event
/// happens.
fn contend(setup: &Setup, event: Event) -> Report {
    let (spec, deployment) = (&setup.spec, &setup.deployment);
    let mut report = Report::default();
    let admin_client = setup.direct.client();
    let admin = Handle::new(&setup.direct, &admin_client);
    admin.prepare(&setup.direct);
    let mut witness = spec.witness();

    let mut workers: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child_at("work", spec.encode()))
        .collect();
    for worker in &mut workers {
        worker.wait_for_line("READY", Duration::from_secs(30));
    }
    set(&mut witness, "last_exit", now_ms());
    let s0 = checks::snapshot(deployment);
    let go = Instant::now();
    set(&mut witness, "go", 1);
    thread::sleep(BEFORE);
    let s1 = checks::snapshot(deployment);
    let t1 = Instant::now();
    let outcome: Outcome = event.fire(&mut Stage {
        deployment,
        spec,
        admin: &admin,
        witness: &mut witness,
        proxy: setup.proxy.as_ref(),
    });
    let s2 = checks::snapshot(deployment);
    let t2 = Instant::now();
    thread::sleep(after_window());
    let s3 = checks::snapshot(deployment);
    let t3 = Instant::now();
    set(&mut witness, "stop", 1);

    let (mut results, mut errors) = (Vec::new(), Vec::new());
    for worker in &mut workers {
        for line in worker.lines_with_prefix_until_exit("", Duration::from_secs(60)) {
            if let Some(result) = line.strip_prefix("RESULT ") {
                results.push(result.to_owned());
            } else if let Some(error) = line.strip_prefix("ERROR ") {
                errors.push(error.to_owned());
            }
        }
    }
    let ran = go.elapsed();
    let tally = Tally::parse(&results, &errors);
    let threads = PROCESSES * THREADS;
    let allowed = BASE + outcome.allowance;
    let (before, during, after) = (
        cost(&s0, &s1, threads, t1 - go),
        cost(&s1, &s2, threads, t2 - t1),
        cost(&s2, &s3, threads, t3 - t2),
    );
    report.figure(format!(
        "{} entries by {PROCESSES}×{THREADS} in {} ms, overlaps {}, timeouts {}, max wait {} ms, max gap {} ms (allowed {} ms)",
        tally.entries,
        ran.as_millis(),
        tally.overlaps,
        tally.timeouts,
        tally.max_wait,
        tally.max_gap,
        allowed.as_millis()
    ));
    report.figure(format!(
        "cost {before:.0}/{during:.0}/{after:.0} cmd/thread/s before/during/after"
    ));
    if !outcome.note.is_empty() {
        report.figure(outcome.note.clone());
    }
    report.errors(&tally);
    report.check(tally.entries > 0, || "nobody ever got in".into());
    report.check(tally.overlaps == 0, || {
        format!("{} entries overlapped another holder", tally.overlaps)
    });
    report.check(tally.timeouts == 0, || {
        format!("{} entries waited out their 20 s", tally.timeouts)
    });
    if spec.sync != Sync::Rate {
        report.check(Duration::from_millis(tally.max_gap) <= allowed, || {
            format!(
                "the synchronizer stayed shut {} ms with waiters at its door (allowed {} ms)",
                tally.max_gap,
                allowed.as_millis()
            )
        });
    }
    let ceiling = cost_ceiling(spec.max_park);
    for (window, figure, from, to) in [
        ("before", before, &s0, &s1),
        ("during", during, &s1, &s2),
        ("after", after, &s2, &s3),
    ] {
        report.check(figure <= ceiling, || {
            format!(
                "waiting cost {window} the event: {figure:.0} cmd/thread/s (ceiling {ceiling:.0}); most sent: {}",
                checks::top_commands(from, to)
            )
        });
    }
    if let Some(mut victim) = outcome.victim {
        set(&mut witness, "victim-release", 1);
        let after = victim.wait_for_line("AFTER", Duration::from_secs(30));
        report.figure(format!("stopped holder: lost/release {after}"));
        report.check(after == "1 lost", || {
            format!("a holder stopped past its lease did not learn it lost its hold: {after}")
        });
    }
    match &admin {
        Handle::Rate(_) => {
            let most = spec.permits as f64 * (ran.as_secs_f64() + 1.5);
            report.check(tally.entries as f64 <= most, || {
                format!(
                    "{} permits granted in {} ms at {}/s",
                    tally.entries,
                    ran.as_millis(),
                    spec.permits
                )
            });
        }
        Handle::Sem(sem) => {
            let settled = within(LEASE + Duration::from_secs(3), || {
                sem.total_permits().ok() == Some(spec.permits)
                    && sem.available_permits().ok() == Some(spec.permits)
            });
            let (total, free) = (sem.total_permits(), sem.available_permits());
            report.figure(format!("total {total:?}, free {free:?}"));
            report.check(settled, || {
                format!(
                    "the semaphore's total is not exact: total {total:?}, free {free:?}, expected {}",
                    spec.permits
                )
            });
        }
        _ => {}
    }
    if spec.sync == Sync::Fair {
        fair_order(setup, &mut report);
    }
    if event == Event::WaiterKilled {
        // Once more as the name's last use: what the dead waiter left must
        // expire by itself.
        crate::events::waiter_killed(&mut Stage {
            deployment,
            spec,
            admin: &admin,
            witness: &mut witness,
            proxy: setup.proxy.as_ref(),
        });
    }
    report
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn within(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Five clients queue 150 ms apart behind the test's hold; they must get
/// the fair lock in the order they came.
fn fair_order(setup: &Setup, report: &mut Report) {
    const WAITERS: usize = 5;
    let spec = &setup.spec;
    let admin_client = setup.direct.client();
    let guard = match admin_client
        .fair_lock(&spec.name)
        .unwrap()
        .try_lock_for(Duration::from_secs(20))
    {
        Ok(Some(guard)) => guard,
        other => {
            report.check(false, || {
                format!("the order probe could not take the fair lock: {other:?}")
            });
            return;
        }
    };
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|index| {
            let client = spec.client();
            let name = spec.name.clone();
            let served = std::sync::Arc::clone(&served);
            let waiter = thread::spawn(move || {
                let lock = client.fair_lock(&name).unwrap();
                match lock.try_lock_for(Duration::from_secs(30)) {
                    Ok(Some(guard)) => {
                        served.lock().unwrap().push(index);
                        thread::sleep(Duration::from_millis(20));
                        let _ = guard.unlock();
                    }
                    Ok(None) => served.lock().unwrap().push(100 + index),
                    Err(_) => served.lock().unwrap().push(200 + index),
                }
            });
            thread::sleep(Duration::from_millis(150));
            waiter
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    guard.unlock().unwrap();
    for waiter in waiters {
        waiter.joined();
    }
    let order = served.lock().unwrap().clone();
    report.figure(format!("fair order {order:?}"));
    report.check(order == (0..WAITERS).collect::<Vec<_>>(), || {
        format!("the fair lock served out of arrival order: {order:?}")
    });
}

/// After the cell, only the documented keys may stay without a TTL
/// (waiting out the event's leases first).
fn no_key_without_ttl(setup: &Setup, report: &mut Report) {
    let mut left = Vec::new();
    let clean = within(LEASE + Duration::from_secs(3), || {
        left = checks::keys_without_ttl(&setup.deployment);
        left.is_empty()
    });
    report.check(clean, || format!("keys without a TTL: {left:?}"));
}

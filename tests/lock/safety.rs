//! Ways to a second holder found by an outside review (issue 9, S1–S3):
//! each test makes the situation and asserts that no other client can take
//! the lock while its first holder still believes it holds it.

use crate::support::{Deployment, Topology};

use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use crate::support::{eventually, lock_key};
use redbaton::Client;
use testkit::RedisServer;

/// A client whose renewed locks live 3 s between renewals (every 1 s).
fn renewing_client(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .default_lease(Duration::from_secs(3))
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(lock_key(name))
        .query(&mut server.connection())
        .unwrap()
}

/// S1 (a): `extend` with a lease shorter than what is left changes nothing.
#[test]
fn extend_with_a_short_lease_never_cuts_a_renewed_lock_short() {
    let server = RedisServer::start();
    let (holder, other) = (renewing_client(&server), renewing_client(&server));
    let lock = holder.lock("extended").unwrap();
    let guard = lock.lock().unwrap();
    guard.extend(Duration::from_millis(200)).unwrap();
    assert!(pttl(&server, "extended") > 2_000, "the lease was cut short");
    thread::sleep(Duration::from_millis(600));
    assert!(
        other
            .lock("extended")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_none(),
        "another client took a lock whose holder still works"
    );
    assert!(!guard.is_lost());
    guard.unlock().unwrap();
}

/// S1 (b) and (c): re-entering a renewed lock through a handle with a short
/// fixed lease, and then releasing that inner guard, leave the ownership as
/// it was: renewed, and never shorter.
#[test]
fn reentry_through_a_short_fixed_lease_never_cuts_a_renewed_lock_short() {
    let server = RedisServer::start();
    let (holder, other) = (renewing_client(&server), renewing_client(&server));
    let lock = holder.lock("mixed").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock
        .with_fixed_lease(Duration::from_millis(200))
        .unwrap()
        .lock()
        .unwrap();
    assert_eq!(inner.fencing_token(), outer.fencing_token(), "a re-entry");
    assert!(
        pttl(&server, "mixed") > 2_000,
        "re-entry cut the lease short"
    );
    thread::sleep(Duration::from_millis(600));
    let intruder = other.lock("mixed").unwrap();
    assert!(
        intruder.try_lock().unwrap().is_none(),
        "taken after re-entry"
    );
    assert!(!inner.is_lost() && !outer.is_lost());

    inner.unlock().unwrap();
    assert!(
        pttl(&server, "mixed") > 2_000,
        "the inner release cut the lease short"
    );
    // Past several of the inner guard's leases and past the client's lease:
    // the watchdog still renews the ownership.
    thread::sleep(Duration::from_millis(3_500));
    assert!(
        intruder.try_lock().unwrap().is_none(),
        "taken after release"
    );
    assert!(!outer.is_lost());
    outer.unlock().unwrap();
    assert!(
        intruder.try_lock().unwrap().is_some(),
        "free after the last"
    );
}

/// S1, the other way round: a fixed ownership re-entered through a renewed
/// handle stays fixed, so a fixed lease remains a bound on how long the
/// lock can be held.
#[test]
fn a_fixed_ownership_re_entered_through_a_renewed_handle_still_ends_on_time() {
    let server = RedisServer::start();
    let client = renewing_client(&server);
    let renewed = client.lock("bounded").unwrap();
    let fixed = renewed
        .with_fixed_lease(Duration::from_millis(800))
        .unwrap();
    let outer = fixed.lock().unwrap();
    let inner = renewed.lock().unwrap();
    assert!(pttl(&server, "bounded") <= 800);
    eventually(Duration::from_secs(3), "the fixed lease to end", || {
        !renewed.is_locked().unwrap()
    });
    assert!(outer.is_lost() && inner.is_lost());
    assert_eq!(client.watchdog_stats().renewals, 0, "never renewed");
}

/// S2: tokens after a restart from an older snapshot are above every token
/// issued before it.
#[test]
fn fencing_tokens_keep_growing_after_a_restart_from_an_older_snapshot() {
    let deployment = Deployment::start(Topology::Single);
    let (server, client) = (deployment.server(), deployment.client());
    let lock = client.lock("fenced").unwrap();
    let take = || {
        let guard = lock.lock().unwrap();
        let token = guard.fencing_token();
        guard.unlock().unwrap();
        token
    };
    let before_save: Vec<u64> = (0..3).map(|_| take()).collect();
    redis::cmd("SAVE")
        .query::<()>(&mut server.connection())
        .unwrap();
    let after_save: Vec<u64> = (0..3).map(|_| take()).collect();

    server.restart_keeping_data();
    let restored: u64 = redis::cmd("GET")
        .arg("redbaton:{fenced}:fence")
        .query(&mut server.connection())
        .unwrap();
    // The counter holds the last token plus the tokens set aside for
    // in-memory hand-offs (`max_local_handoffs`, 64 by default).
    assert_eq!(
        restored,
        before_save[2] + 64,
        "the restart rolled the counter back to the snapshot"
    );

    let next = take();
    let highest = after_save.iter().chain(&before_save).max().unwrap();
    assert!(
        next > *highest,
        "token {next} after the rollback is not above {highest} ({before_save:?}, {after_save:?})"
    );
}

/// Records the log lines of this test binary.
struct Recorder(Mutex<Vec<String>>);

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push(record.args().to_string());
    }
    fn flush(&self) {}
}

fn recorded_logs() -> &'static Recorder {
    static RECORDER: OnceLock<&'static Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static Recorder = Box::leak(Box::new(Recorder(Mutex::new(Vec::new()))));
        log::set_logger(recorder).unwrap();
        log::set_max_level(log::LevelFilter::Debug);
        recorder
    })
}

/// S3: a server that may evict keys is named in a warning, and a renewed
/// guard whose lock was evicted reports the loss at its next renewal.
#[test]
fn eviction_of_a_held_lock_is_warned_about_and_reported_as_lost() {
    let logs = recorded_logs();
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "volatile-ttl"]);
    let (holder, other) = (renewing_client(&server), renewing_client(&server));
    let lock = holder.lock("evicted").unwrap();
    let guard = lock.lock().unwrap();
    let warned = logs
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.contains("maxmemory-policy volatile-ttl"));
    assert!(warned, "no warning about the eviction policy");

    // Cache writes with long TTLs: volatile-ttl evicts the shortest first.
    let mut raw = server.connection();
    let value = "x".repeat(4096);
    let mut written = 0;
    while redis::cmd("EXISTS")
        .arg(lock_key("evicted"))
        .query::<bool>(&mut raw)
        .unwrap()
    {
        assert!(written < 50_000, "the lock key was never evicted");
        let _: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("cache:{written}"))
            .arg(&value)
            .arg("EX")
            .arg(3600)
            .query(&mut raw);
        written += 1;
    }
    // The danger, shown: another client takes the lock meanwhile.
    let intruder = other.lock("evicted").unwrap().try_lock().unwrap();
    assert!(intruder.is_some());
    // Renewals run every second: the holder learns it within one.
    eventually(
        Duration::from_millis(1_500),
        "the guard to report the loss",
        || guard.is_lost(),
    );
    assert!(guard.unlock().unwrap_err().is_lost());
}

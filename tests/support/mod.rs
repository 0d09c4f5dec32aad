//! Helpers shared by the integration tests. Servers come from `testkit`.
#![allow(dead_code)] // each test file uses its own subset

use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

/// The Redis deployments a test can run against. One server today; Redis
/// Cluster, Sentinel and several independent masters join as variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One `redis-server`.
    Single,
}

/// Servers of one topology, started for a test and killed when dropped.
#[derive(Debug)]
pub struct Deployment {
    topology: Topology,
    servers: Vec<RedisServer>,
}

impl Deployment {
    /// Starts `topology` on free loopback ports.
    pub fn start(topology: Topology) -> Deployment {
        let servers = match topology {
            Topology::Single => vec![RedisServer::start()],
        };
        Deployment { topology, servers }
    }

    /// Which topology this is.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// A client builder for this deployment with the test defaults (a
    /// short I/O timeout); add settings, then `build()`.
    pub fn builder(&self) -> redbaton::ClientBuilder {
        Client::builder(self.servers[0].url()).io_timeout(Duration::from_secs(2))
    }

    /// A client with the test defaults.
    pub fn client(&self) -> Client {
        self.builder().build().expect("client settings are valid")
    }

    /// The server, for fault injection and direct commands. For topologies
    /// of several servers: the one that holds the test's keys.
    pub fn server(&self) -> &RedisServer {
        &self.servers[0]
    }
}

/// A client on `server` with settings suited to tests: short I/O timeout.
pub fn client(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .io_timeout(Duration::from_secs(2))
        .build()
        .expect("client settings are valid")
}

/// Polls `condition` every few ms until it holds; panics at `timeout`.
pub fn eventually(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The lock key of `name` under the default prefix, as the README documents
/// it (names used in tests contain no `%`, `{` or `}`).
pub fn lock_key(name: &str) -> String {
    format!("redbaton:{{{name}}}:lock")
}

/// The baton key of `name` under the default prefix.
pub fn baton_key(name: &str) -> String {
    format!("redbaton:{{{name}}}:baton")
}

/// Environment variables that tell a re-executed test binary what to do.
pub const CHILD_ROLE: &str = "REDBATON_CHILD_ROLE";
/// The Redis URL a child process works against.
pub const CHILD_URL: &str = "REDBATON_CHILD_URL";

/// Re-runs this test binary's `child_entry` test as a child process with
/// `role`, working against `server`.
pub fn spawn_child(role: &str, server: &RedisServer) -> testkit::ChildProcess {
    testkit::ChildProcess::spawn_test(
        "child_entry",
        &[(CHILD_ROLE, role.to_owned()), (CHILD_URL, server.url())],
    )
}

/// A file's child-process roles: runs `role` against `url` and returns
/// true, or returns false when the role is another file's.
pub type ChildRoles = fn(&str, &str) -> bool;

/// The body of a binary's `child_entry` test: hands this child's role to
/// the first of `roles` that knows it. Does nothing in a normal test run.
pub fn run_child_role(roles: &[ChildRoles]) {
    let Some((role, url)) = child_role() else {
        return;
    };
    assert!(
        roles.iter().any(|run| run(&role, &url)),
        "unknown child role {role}"
    );
}

/// In a child process: its role and Redis URL. `None` in a normal test run.
pub fn child_role() -> Option<(String, String)> {
    Some((
        std::env::var(CHILD_ROLE).ok()?,
        std::env::var(CHILD_URL).ok()?,
    ))
}

/// Joins a thread with a deadline, so that a hung lock call fails the test
/// instead of hanging it.
pub trait JoinWithin<T> {
    /// The thread's result; panics if it panicked or is still running after
    /// two minutes.
    fn joined(self) -> T;
}

/// Polls `is_finished` until two minutes have passed.
fn wait_finished(is_finished: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !is_finished() {
        assert!(
            Instant::now() < deadline,
            "a test thread is still running after 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl<T> JoinWithin<T> for std::thread::JoinHandle<T> {
    fn joined(self) -> T {
        wait_finished(|| self.is_finished());
        self.join().expect("the test thread panicked")
    }
}

impl<T> JoinWithin<T> for std::thread::ScopedJoinHandle<'_, T> {
    fn joined(self) -> T {
        wait_finished(|| self.is_finished());
        self.join().expect("the test thread panicked")
    }
}

/// A rate limiter named `name` on `client`, configured (if nobody has yet)
/// to `permits` per `per` shared by every client.
pub fn overall_limiter(
    client: &Client,
    name: &str,
    permits: u64,
    per: Duration,
) -> redbaton::RateLimiter {
    let limiter = client.rate_limiter(name).expect("valid limiter name");
    limiter
        .set_rate(redbaton::RateMode::Overall, permits, per)
        .expect("valid rate");
    limiter
}

//! Helpers shared by the integration tests. Servers come from `testkit`.
#![allow(dead_code)] // each test file uses its own subset

use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

/// The Redis deployments a test can run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One `redis-server`.
    Single,
    /// A Redis Cluster of three masters without replicas.
    #[cfg(feature = "cluster")]
    Cluster,
    /// A master, one replica and three sentinels.
    #[cfg(feature = "sentinel")]
    Sentinel,
    /// Three independent masters under a Redlock quorum.
    #[cfg(feature = "redlock")]
    Masters,
}

/// How many masters the `Masters` topology starts.
#[cfg(feature = "redlock")]
pub const QUORUM_MASTERS: usize = 3;

/// Servers of one topology, started for a test and killed when dropped.
#[derive(Debug)]
pub struct Deployment {
    servers: Servers,
}

#[derive(Debug)]
enum Servers {
    Single(RedisServer),
    #[cfg(feature = "cluster")]
    Cluster(testkit::RedisCluster),
    #[cfg(feature = "sentinel")]
    Sentinel(testkit::RedisSentinels),
    #[cfg(feature = "redlock")]
    Masters(Vec<RedisServer>),
}

/// The service name of the sentinel topology.
pub const SERVICE: &str = "locks";

impl Deployment {
    /// Starts `topology` on free loopback ports.
    pub fn start(topology: Topology) -> Deployment {
        let servers = match topology {
            Topology::Single => Servers::Single(RedisServer::start()),
            #[cfg(feature = "cluster")]
            Topology::Cluster => Servers::Cluster(testkit::RedisCluster::start(3, 0)),
            #[cfg(feature = "sentinel")]
            Topology::Sentinel => Servers::Sentinel(testkit::RedisSentinels::start(SERVICE, 1, 3)),
            #[cfg(feature = "redlock")]
            Topology::Masters => {
                Servers::Masters((0..QUORUM_MASTERS).map(|_| RedisServer::start()).collect())
            }
        };
        Deployment { servers }
    }

    /// The sentinel topology with `replicas` replicas (the usual one has
    /// one): with two, a failover leaves a replica to confirm
    /// `replica_acks` writes on the new master.
    #[cfg(feature = "sentinel")]
    pub fn sentinels_with_replicas(replicas: usize) -> Deployment {
        Deployment {
            servers: Servers::Sentinel(testkit::RedisSentinels::start(SERVICE, replicas, 3)),
        }
    }

    /// Which topology this is.
    pub fn topology(&self) -> Topology {
        match &self.servers {
            Servers::Single(_) => Topology::Single,
            #[cfg(feature = "cluster")]
            Servers::Cluster(_) => Topology::Cluster,
            #[cfg(feature = "sentinel")]
            Servers::Sentinel(_) => Topology::Sentinel,
            #[cfg(feature = "redlock")]
            Servers::Masters(_) => Topology::Masters,
        }
    }

    /// What a client of this deployment is built from.
    pub fn redbaton_topology(&self) -> redbaton::Topology {
        match &self.servers {
            Servers::Single(server) => redbaton::Topology::server(&server.url()),
            #[cfg(feature = "cluster")]
            Servers::Cluster(cluster) => redbaton::Topology::cluster(cluster.seed_urls()),
            #[cfg(feature = "sentinel")]
            Servers::Sentinel(sentinels) => {
                redbaton::Topology::sentinel(SERVICE, sentinels.sentinel_urls())
            }
            #[cfg(feature = "redlock")]
            Servers::Masters(masters) => {
                redbaton::Topology::masters(masters.iter().map(RedisServer::url))
            }
        }
    }

    /// A client builder for this deployment with the test defaults (a
    /// short I/O timeout); add settings, then `build()`.
    pub fn builder(&self) -> redbaton::ClientBuilder {
        Client::builder(self.redbaton_topology()).io_timeout(Duration::from_secs(2))
    }

    /// A client with the test defaults.
    pub fn client(&self) -> Client {
        self.builder().build().expect("client settings are valid")
    }

    /// The one server. Panics on topologies of several servers, whose
    /// tests use [`Deployment::server_for`].
    pub fn server(&self) -> &RedisServer {
        match &self.servers {
            Servers::Single(server) => server,
            #[allow(unreachable_patterns)]
            _ => panic!("a test of several servers asks for the one that holds a key"),
        }
    }

    /// A server holding `key` (the master serving its slot, the
    /// sentinels' master at the start, or the first of a quorum's masters,
    /// which all hold it).
    pub fn server_for(&self, key: &str) -> &RedisServer {
        self.servers_for(key)[0]
    }

    /// Every server that holds `key`: one, or every master of a quorum.
    pub fn servers_for(&self, key: &str) -> Vec<&RedisServer> {
        let _ = key;
        match &self.servers {
            Servers::Single(server) => vec![server],
            #[cfg(feature = "cluster")]
            Servers::Cluster(cluster) => vec![cluster.master_of_slot(cluster.slot_of(key))],
            #[cfg(feature = "sentinel")]
            Servers::Sentinel(sentinels) => vec![sentinels.master()],
            #[cfg(feature = "redlock")]
            Servers::Masters(masters) => masters.iter().collect(),
        }
    }

    /// Whether this is a quorum of independent masters: every fresh
    /// ownership there costs a second round (its fencing token).
    pub fn is_quorum(&self) -> bool {
        #[cfg(feature = "redlock")]
        if let Servers::Masters(_) = self.servers {
            return true;
        }
        false
    }

    /// The cluster, for cluster-only tests.
    #[cfg(feature = "cluster")]
    pub fn cluster(&self) -> &testkit::RedisCluster {
        match &self.servers {
            Servers::Cluster(cluster) => cluster,
            _ => panic!("not a cluster"),
        }
    }

    /// The sentinel deployment, for sentinel-only tests.
    #[cfg(feature = "sentinel")]
    pub fn sentinels(&self) -> &testkit::RedisSentinels {
        match &self.servers {
            Servers::Sentinel(sentinels) => sentinels,
            _ => panic!("not a sentinel deployment"),
        }
    }
}

/// Runs one test body against every topology the enabled features offer:
/// `across_topologies! { fn name(deployment) { ... } }` makes a module
/// `name` with one test per topology (`single`, `cluster`, `sentinel`,
/// `masters`), each starting its deployment and passing it as
/// `&Deployment`. `across_topologies! { but_masters; fn ... }` leaves the
/// quorum out, for what a quorum does not offer (it says so in a test of
/// its own).
#[macro_export]
macro_rules! across_topologies {
    (but_masters; $(#[$meta:meta])* fn $name:ident($deployment:ident) $body:block) => {
        $crate::across_topologies!(@module [] $(#[$meta])* fn $name($deployment) $body);
    };
    ($(#[$meta:meta])* fn $name:ident($deployment:ident) $body:block) => {
        $crate::across_topologies!(@module [masters] $(#[$meta])* fn $name($deployment) $body);
    };
    (@module [$($masters:ident)?] $(#[$meta:meta])* fn $name:ident($deployment:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($deployment: &$crate::support::Deployment) $body

            #[test]
            fn single() {
                body(&$crate::support::Deployment::start($crate::support::Topology::Single));
            }

            #[cfg(feature = "cluster")]
            #[test]
            fn cluster() {
                body(&$crate::support::Deployment::start($crate::support::Topology::Cluster));
            }

            #[cfg(feature = "sentinel")]
            #[test]
            fn sentinel() {
                body(&$crate::support::Deployment::start($crate::support::Topology::Sentinel));
            }

            $(
            #[cfg(feature = "redlock")]
            #[test]
            fn $masters() {
                body(&$crate::support::Deployment::start($crate::support::Topology::Masters));
            }
            )?
        }
    };
}

/// Waits (2 s at most) until a replica of `master` has every write made
/// to it so far. `WAIT` counts only the writes of its own connection, so
/// this writes `key` (one the master serves) first and waits for that.
pub fn wait_for_replica(master: &RedisServer, key: &str) {
    let mut conn = master.connection();
    redis::cmd("INCR").arg(key).query::<()>(&mut conn).unwrap();
    let acked: u32 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut conn)
        .unwrap();
    assert!(acked >= 1, "a replica has every write so far");
}

/// `CONFIG SET key value` on `server`.
pub fn config_set(server: &RedisServer, key: &str, value: &str) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query::<()>(&mut server.connection())
        .unwrap();
}

/// Cuts the sentinels' replica off its master: the link is killed and the
/// replica cannot log in again (a user the master does not have), so writes
/// from now on stay on the master alone.
#[cfg(feature = "sentinel")]
pub fn cut_replica(sentinels: &testkit::RedisSentinels) {
    let (master, replica) = (sentinels.master(), &sentinels.replicas()[0]);
    wait_for_replica(master, "test-sync");
    config_set(replica, "masteruser", "no-such-user");
    config_set(replica, "masterauth", "wrong");
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query::<u32>(&mut master.connection())
        .unwrap();
    eventually(Duration::from_secs(5), "the replica's link is down", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.connection())
            .unwrap();
        info.contains("master_link_status:down")
    });
}

/// Lets the sentinels' replica log in to its master again, and waits until
/// it has every write so far.
#[cfg(feature = "sentinel")]
pub fn restore_replica(sentinels: &testkit::RedisSentinels) {
    let replica = &sentinels.replicas()[0];
    config_set(replica, "masteruser", "");
    config_set(replica, "masterauth", "");
    wait_for_replica(sentinels.master(), "test-sync");
}

/// A client on `server` with settings suited to tests: short I/O timeout.
pub fn client(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .io_timeout(Duration::from_secs(2))
        .build()
        .expect("client settings are valid")
}

/// `builder` with an event hook that sends the moment of each
/// `RenewalFailed` (a watchdog round that found Redis unreachable or busy)
/// on the returned channel.
pub fn telling_renewal_failures(
    builder: redbaton::ClientBuilder,
) -> (redbaton::ClientBuilder, std::sync::mpsc::Receiver<Instant>) {
    let (failed, failures) = std::sync::mpsc::channel();
    let failed = std::sync::Mutex::new(failed);
    let builder = builder.on_event(move |event| {
        if let redbaton::Event::RenewalFailed { .. } = event {
            let _ = failed.lock().unwrap().send(Instant::now());
        }
    });
    (builder, failures)
}

/// The lock's ACL line as docs/security.md documents it, without its
/// `ACL SETUSER <name> on ><password>` head.
pub fn documented_acl() -> &'static str {
    include_str!("../../docs/security.md")
        .lines()
        .find_map(|line| line.strip_prefix("ACL SETUSER locker on >long-random-password "))
        .expect("docs/security.md documents the ACL line")
}

/// Whether docs/security.md states `words` (its text with whitespace
/// folded, so that a table row or a wrapped sentence matches).
pub fn security_page_says(words: &str) -> bool {
    let flat: String = include_str!("../../docs/security.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    flat.contains(words)
}

/// Makes `user` (password `pw`) on `server`, limited to the documented
/// ACL line plus the rules `extra` (a synchronizer's row of the page),
/// and returns its URL.
pub fn documented_acl_user(server: &RedisServer, user: &str, extra: &str) -> String {
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(user).arg("on").arg(">pw");
    for rule in documented_acl()
        .split_whitespace()
        .chain(extra.split_whitespace())
    {
        setuser.arg(rule);
    }
    setuser.query::<()>(&mut server.connection()).unwrap();
    format!("redis://{user}:pw@127.0.0.1:{}/", server.port())
}

/// Polls `condition` every few ms until it holds; panics at `timeout`.
/// `url` (of `server`, or of a proxy to it) as a user `server` refuses the
/// grant channel to ([`testkit::ungranted_user`]): its client's waiters
/// are never granted the lock, so a release opens the hand-over window
/// for them, as before grants (and as under an ACL without the channel).
#[allow(dead_code)]
pub fn without_grants(server: &RedisServer, url: &str) -> String {
    testkit::ungranted_user(&mut server.connection(), url)
}

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

/// How many waiters are parked in Redis on `server` now: connections
/// blocked in `BLPOP` (a Cluster's parks, one per waited name) plus the
/// (client, baton key) pairs the server tracks (`tracking_total_items`:
/// one server, Sentinel and a quorum park every waited name of a client
/// on two connections, each name registered for the server to announce
/// its next change). Either way a process's threads waiting on one name
/// show once.
pub fn parked(server: &RedisServer) -> u64 {
    let mut conn = server.connection();
    let mut field = |section: &str, name: &str| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut conn)
            .expect("INFO");
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO {section} reports {name}"))
    };
    field("clients", "blocked_clients:") + field("stats", "tracking_total_items:")
}

/// The commands `server` ran while `act` ran (nothing else may use the
/// server meanwhile).
pub fn commands_of(
    server: &RedisServer,
    act: impl FnOnce(),
) -> std::collections::BTreeMap<String, u64> {
    let before = server.command_calls();
    act();
    server.commands_since(&before)
}

/// The commands `server` ran for one hand-off to a waiter of another
/// client: `wait` runs on a thread of its own (it asks, and its client
/// parks it on `server`); once it is the one waiter parked there,
/// `release` lets go. Counted from just before the release until the
/// waiter's thread has finished.
pub fn hand_off_commands(
    server: &RedisServer,
    wait: impl FnOnce() + Send + 'static,
    release: impl FnOnce(),
) -> std::collections::BTreeMap<String, u64> {
    let waiter = std::thread::spawn(wait);
    eventually(Duration::from_secs(10), "the waiter parked", || {
        parked(server) == 1
    });
    let before = server.command_calls();
    release();
    waiter.joined();
    server.commands_since(&before)
}

/// The scripts `server` ran from a call until its waiter parked: `wait`
/// runs on a thread of its own (it asks, and its client parks it on
/// `server`); once it is the one waiter parked there, `release` lets go.
/// Counted from just before `wait` started until it parked.
pub fn scripts_until_parked(
    server: &RedisServer,
    wait: impl FnOnce() + Send + 'static,
    release: impl FnOnce(),
) -> u64 {
    let before = server.command_calls();
    let waiter = std::thread::spawn(wait);
    eventually(Duration::from_secs(10), "the waiter parked", || {
        parked(server) == 1
    });
    let until_parked = server.commands_since(&before);
    release();
    waiter.joined();
    scripts_run(&until_parked)
}

/// The scripts that ran, from [`RedisServer::commands_since`]'s counts:
/// `EVALSHA` calls but those answered `NOSCRIPT` (one per `SCRIPT LOAD`
/// that followed).
pub fn scripts_run(used: &std::collections::BTreeMap<String, u64>) -> u64 {
    let loads = used.get("script|load").copied().unwrap_or(0);
    used.get("evalsha").copied().unwrap_or(0) - loads
}

/// The calling thread's id in `/proc/self/task/`, for [`is_asleep`].
pub fn thread_id() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name()
        .and_then(|tid| tid.to_str())
        .and_then(|tid| tid.parse().ok())
        .expect("a thread id")
}

/// Whether thread `tid` of this process sleeps in the kernel now (state
/// `S`: a futex of a condition variable or channel, a socket read). A test
/// uses it to know that a thread it started got as far as blocking, when
/// nothing it can see in Redis says so (a waiter queued in its process).
pub fn is_asleep(tid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // "tid (name) S ...": the state follows the name's closing parenthesis.
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'))
}

/// The lock key of `name` under the default prefix, as docs/how-it-works.md documents
/// it (names used in tests contain no `%`, `{` or `}`).
pub fn lock_key(name: &str) -> String {
    format!("redbaton:{{{}}}:lock", hash_tag(name))
}

/// The hash tag of `name` as the key layout (docs/how-it-works.md) gives it: `%`, `{`
/// and `}` percent-encoded.
pub fn hash_tag(name: &str) -> String {
    name.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// The baton key of `name` under the default prefix.
pub fn baton_key(name: &str) -> String {
    format!("redbaton:{{{}}}:baton", hash_tag(name))
}

/// Environment variables that tell a re-executed test binary what to do.
pub const CHILD_ROLE: &str = "REDBATON_CHILD_ROLE";
/// The Redis URL a child process works against.
pub const CHILD_URL: &str = "REDBATON_CHILD_URL";

/// Re-runs this test binary's `child_entry` test as a child process with
/// `role`, working against `server`.
pub fn spawn_child(role: &str, server: &RedisServer) -> testkit::ChildProcess {
    spawn_child_at(role, server.url())
}

/// [`spawn_child`] with any address text (a list of seed URLs, say).
pub fn spawn_child_at(role: &str, url: String) -> testkit::ChildProcess {
    testkit::ChildProcess::spawn_test(
        "child_entry",
        &[(CHILD_ROLE, role.to_owned()), (CHILD_URL, url)],
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

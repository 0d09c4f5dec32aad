//! [`ClientBuilder`]: where a client's Redis is, and its settings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;

use super::Client;
use crate::backend::{Backend, Grants};
use crate::config::{
    default_client_name, ClockDrift, Config, NodeTimeout, ReplicaAcks, MAX_DRIFT_RATIO,
};
use crate::context::Context;
use crate::error::Error;
use crate::observe::{Event, Observer};
use crate::scripts;
#[cfg(feature = "redlock")]
use crate::sync::lock::QuorumLock;
use crate::sync::lock::{DeploymentLock, RawLock};

/// Where a client's Redis is: one server, a Redis Cluster (feature
/// `cluster`), a master watched by Redis Sentinel (feature `sentinel`), or
/// independent masters for a Redlock quorum (feature `redlock`).
///
/// A `&str` or `String` is the URL of one server:
/// `redis://[user:password@]host[:port][/db]` (or `rediss://` with the `tls`
/// feature, or `redis+unix:///path`).
///
/// # Examples
///
/// ```
/// use redbaton::Topology;
///
/// let one = Topology::server("redis://127.0.0.1:6379/");
/// # #[cfg(feature = "cluster")]
/// let cluster = Topology::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
/// # #[cfg(feature = "sentinel")]
/// let sentinel = Topology::sentinel("locks", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"]);
/// ```
pub struct Topology {
    /// The URLs are parsed at once, errors reported by `build`; the URL
    /// text itself is not kept, so no password can end up in `Debug`
    /// output.
    form: Form,
}

enum Form {
    Server(RedisResult<redis::Client>),
    #[cfg(feature = "cluster")]
    Cluster(RedisResult<Vec<redis::Client>>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        service: String,
        sentinels: RedisResult<Vec<redis::Client>>,
        /// Whose user, password, database and TLS settings reach the
        /// master; `None`: the first sentinel's.
        master: Option<RedisResult<redis::Client>>,
    },
    #[cfg(feature = "redlock")]
    Masters(RedisResult<Vec<redis::Client>>),
}

impl Topology {
    /// One Redis server at `url`.
    pub fn server(url: &str) -> Topology {
        Topology {
            form: Form::Server(redis::Client::open(url)),
        }
    }

    /// A Redis Cluster, first reached through the nodes at `seeds` (one is
    /// enough; more survive one being down). The slot map is read from
    /// whichever answers, and every other node is reached with the first
    /// seed's user, password and TLS settings. Each lock lives on the
    /// master serving its slot.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<I, S>(seeds: I) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Topology {
            form: Form::Cluster(open_all(seeds)),
        }
    }

    /// The master of `service` as the sentinels at `sentinels` know it,
    /// followed across failovers. The master is reached with the first
    /// sentinel URL's user, password, database and TLS settings; when the
    /// sentinels and the master are secured apart (sentinels without a
    /// password in front of a master with one, say), use
    /// [`Topology::sentinel_with_master_url`].
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel<I, S>(service: &str, sentinels: I) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Topology {
            form: Form::Sentinel {
                service: service.to_owned(),
                sentinels: open_all(sentinels),
                master: None,
            },
        }
    }

    /// [`Topology::sentinel`], with the master reached with `master_url`'s
    /// user, password, database and TLS scheme (`rediss://`) instead of
    /// the first sentinel URL's: the sentinels' URLs then carry only what
    /// the sentinels need. Its host and port are not used (the sentinels
    /// name the master); write any, e.g. `redis://app:secret@master/0`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// // Sentinels without a password, a master with one.
    /// let topology = redbaton::Topology::sentinel_with_master_url(
    ///     "locks",
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"],
    ///     "redis://:master-secret@master/0",
    /// );
    /// let client = redbaton::Client::builder(topology).build()?;
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_with_master_url<I, S>(service: &str, sentinels: I, master_url: &str) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Topology {
            form: Form::Sentinel {
                service: service.to_owned(),
                sentinels: open_all(sentinels),
                master: Some(redis::Client::open(master_url)),
            },
        }
    }

    /// Independent masters (no replication between them), an odd number
    /// of at least three: each lock is held by a majority of them, so it
    /// survives the loss of a minority (the Redlock algorithm).
    #[cfg(feature = "redlock")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
    pub fn masters<I, S>(urls: I) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Topology {
            form: Form::Masters(open_all(urls)),
        }
    }

    /// Applies `f` to every parsed URL.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn map_clients(self, f: impl Fn(redis::Client) -> RedisResult<redis::Client>) -> Topology {
        #[cfg(any(feature = "cluster", feature = "sentinel", feature = "redlock"))]
        let all = |clients: RedisResult<Vec<redis::Client>>| {
            clients.and_then(|clients| clients.into_iter().map(&f).collect::<RedisResult<Vec<_>>>())
        };
        let form = match self.form {
            Form::Server(client) => Form::Server(client.and_then(&f)),
            #[cfg(feature = "cluster")]
            Form::Cluster(seeds) => Form::Cluster(all(seeds)),
            #[cfg(feature = "sentinel")]
            Form::Sentinel {
                service,
                sentinels,
                master,
            } => Form::Sentinel {
                service,
                sentinels: all(sentinels),
                master: master.map(|master| master.and_then(&f)),
            },
            #[cfg(feature = "redlock")]
            Form::Masters(masters) => Form::Masters(all(masters)),
        };
        Topology { form }
    }
}

/// Parses every URL of a list; an empty list is refused.
#[cfg(any(feature = "cluster", feature = "sentinel", feature = "redlock"))]
fn open_all<I, S>(urls: I) -> RedisResult<Vec<redis::Client>>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let clients = urls
        .into_iter()
        .map(|url| redis::Client::open(url.as_ref()))
        .collect::<RedisResult<Vec<_>>>()?;
    if clients.is_empty() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "no URL given",
        )));
    }
    Ok(clients)
}

impl From<&str> for Topology {
    fn from(url: &str) -> Topology {
        Topology::server(url)
    }
}

impl From<String> for Topology {
    fn from(url: String) -> Topology {
        Topology::server(&url)
    }
}

impl From<&String> for Topology {
    fn from(url: &String) -> Topology {
        Topology::server(url)
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = |client: &redis::Client| client.get_connection_info().addr().to_string();
        #[cfg(any(feature = "cluster", feature = "sentinel", feature = "redlock"))]
        let addrs = |clients: &RedisResult<Vec<redis::Client>>| match clients {
            Ok(clients) => clients.iter().map(addr).collect::<Vec<_>>(),
            Err(_) => vec!["<invalid URL>".to_owned()],
        };
        match &self.form {
            Form::Server(Ok(client)) => f.debug_tuple("Server").field(&addr(client)).finish(),
            Form::Server(Err(_)) => f.write_str("Server(<invalid URL>)"),
            #[cfg(feature = "cluster")]
            Form::Cluster(seeds) => f.debug_tuple("Cluster").field(&addrs(seeds)).finish(),
            #[cfg(feature = "sentinel")]
            Form::Sentinel {
                service, sentinels, ..
            } => f
                .debug_struct("Sentinel")
                .field("service", service)
                .field("sentinels", &addrs(sentinels))
                .finish(),
            #[cfg(feature = "redlock")]
            Form::Masters(masters) => f.debug_tuple("Masters").field(&addrs(masters)).finish(),
        }
    }
}

/// Settings of a [`Client`]; every setter documents its default.
///
/// Every setting has a range; [`build`](ClientBuilder::build) refuses a
/// value outside it with [`Error::InvalidConfig`] naming the setting
/// ([`Error::InvalidLease`] for `default_lease`); the setters report
/// nothing.
///
/// | setting | default | range | meaning |
/// |---|---|---|---|
/// | [`prefix`](ClientBuilder::prefix) | `"redbaton"` | non-empty, no `{` or `}` | first segment of every key |
/// | [`client_name`](ClientBuilder::client_name) | `redbaton:<hostname>:<pid>` | 1 to 128 printable ASCII, no spaces | what every connection calls itself (`CLIENT SETNAME`) |
/// | [`pool_size`](ClientBuilder::pool_size) | 8 | 1 to 1024 | connections for lock commands, each held one round trip |
/// | [`parking_connections`](ClientBuilder::parking_connections) | 16 | 1 to 1024 | connections that may sit in `BLPOP` at once per server, one per waited name, where a server refuses tracking or during a Cluster slot's migration (otherwise every waited name parks on two connections per server) |
/// | [`default_lease`](ClientBuilder::default_lease) | 30 s | 1 ms to 1 year | lease of renewed locks; the watchdog renews at a third of it |
/// | [`max_park`](ClientBuilder::max_park) | 2 s | 1 ms to 1 year | longest single `BLPOP`, and how often a plain lock's parked waiters are checked with one `EXISTS`; bounds the cost of a lost wake-up |
/// | [`io_timeout`](ClientBuilder::io_timeout) | 3 s | 1 ms to 1 year | connect, each reply, and each wait for a pooled connection |
/// | [`baton_ttl`](ClientBuilder::baton_ttl) | 5 s | 1 ms to 1 year | how long an unclaimed baton stays |
/// | [`fence_counter_ttl`](ClientBuilder::fence_counter_ttl) | 1 day | 1 ms to 1 year | how long a lock's fencing counter stays after its last acquisition |
/// | [`max_local_handoffs`](ClientBuilder::max_local_handoffs) | 64 | 0 to 1,000,000 | hand-offs to threads of the same client in a row before a release in Redis (in memory for a plain lock's waiter with the same lease); 0 = off |
/// | [`max_local_run`](ClientBuilder::max_local_run) | 2 ms | 1 ms to 1 year | how long such a run of hand-offs may go on, from its first |
/// | [`node_timeout`](ClientBuilder::node_timeout) | 1 % of the lock's lease, 50 ms to `io_timeout` | 1 ms to 1 year | Redlock: how long one master may take in a round before it counts as not there |
/// | [`clock_drift(ratio, fixed)`](ClientBuilder::clock_drift) | 0.01, 2 ms | ratio 0 to 0.5; fixed up to 1 year | Redlock: the allowance `ratio × lease + fixed` for clocks that disagree; a lock is valid for its lease less this and the round's time |
/// | [`replica_acks(n, timeout)`](ClientBuilder::replica_acks) | off | n 1 to 1024; timeout 1 ms to under `io_timeout` | replicas that must confirm each acquisition, hand-off, renewal and last release (`WAIT`) |
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::builder("redis://127.0.0.1/")
///     .prefix("billing")
///     .pool_size(4)
///     .default_lease(Duration::from_secs(10))
///     .build()?;
/// # Ok(())
/// # }
/// ```
pub struct ClientBuilder {
    topology: Topology,
    prefix: String,
    /// `None`: [`default_client_name`].
    client_name: Option<String>,
    pool_size: u32,
    parking_connections: u32,
    default_lease: Duration,
    max_park: Duration,
    io_timeout: Duration,
    baton_ttl: Duration,
    fence_counter_ttl: Duration,
    max_local_handoffs: u32,
    max_local_run: Duration,
    replica_acks: Option<ReplicaAcks>,
    node_timeout: Option<Duration>,
    /// `clock_drift(ratio, fixed)` as given; checked by `build`.
    clock_drift: Option<(f64, Duration)>,
    /// Test-only: whether a sentinel client follows `+switch-master`.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    follow_switches: bool,
    /// The event hooks, if any was set.
    observer: Observer,
    #[cfg(feature = "tls")]
    tls: TlsFiles,
}

/// The certificates given to a [`ClientBuilder`], kept so that each TLS
/// setter can build the clients with all of them.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
struct TlsFiles {
    /// The roots to trust (PEM).
    root: Option<Vec<u8>>,
    /// The client's certificate and key (PEM).
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientBuilder {
    /// A builder for the Redis deployment `topology` (a URL for one
    /// server), with every setting at its default.
    pub fn new(topology: impl Into<Topology>) -> Self {
        ClientBuilder {
            topology: topology.into(),
            prefix: "redbaton".to_owned(),
            client_name: None,
            pool_size: 8,
            parking_connections: 16,
            default_lease: Duration::from_secs(30),
            max_park: Duration::from_secs(2),
            io_timeout: Duration::from_secs(3),
            baton_ttl: Duration::from_secs(5),
            fence_counter_ttl: Duration::from_secs(24 * 3600),
            max_local_handoffs: 64,
            max_local_run: Duration::from_millis(2),
            replica_acks: None,
            node_timeout: None,
            clock_drift: None,
            follow_switches: true,
            observer: Observer::default(),
            #[cfg(feature = "tls")]
            tls: TlsFiles::default(),
        }
    }

    /// The first segment of every key, so that several applications can share
    /// one Redis. Must be non-empty and contain no `{` or `}`.
    /// Defaults to `"redbaton"`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// What this client's connections call themselves on the server
    /// (`CLIENT SETNAME`), so that `CLIENT LIST` tells an operator which
    /// host and process each belongs to. 1 to 128 printable ASCII
    /// characters, no spaces. Defaults to `redbaton:<hostname>:<pid>`. A
    /// server whose ACL refuses `CLIENT SETNAME` leaves the connections
    /// unnamed, with one warning in the log (once per process).
    pub fn client_name(mut self, name: &str) -> Self {
        self.client_name = Some(name.to_owned());
        self
    }

    /// How many connections carry lock commands (acquire, release, ...).
    /// Each is held for one round trip only, so a few serve many threads.
    /// Between 1 and 1024. Defaults to 8.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How many connections may be parked in `BLPOP` at once, per server.
    ///
    /// Every
    /// name a client waits for is parked on two connections per server
    /// (one server, Sentinel's master, each master of a Redlock quorum,
    /// each node of a Cluster), woken by the server's announcements
    /// (`CLIENT TRACKING`): thousands of waited names cost no more
    /// connections than one, and each waiter is woken by its own release.
    /// This limit applies only where a server refuses tracking, and on a
    /// Cluster to waiters of a slot being migrated (parked after
    /// `ASKING` on the importing node): each then parks in `BLPOP` on a
    /// connection of its own, up to this many per server; waiters beyond
    /// the limit look again every maximum park time instead.
    /// Between 1 and 1024. Defaults to 16.
    pub fn parking_connections(mut self, count: u32) -> Self {
        self.parking_connections = count;
        self
    }

    /// The lease of locks taken without a fixed lease: the watchdog renews
    /// it every third of this while the guard lives, and a holder that dies
    /// frees the lock within this long. At least 1 ms, at most a year.
    /// Defaults to 30 s.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// The longest a waiter sits in one `BLPOP` before it looks at the lock
    /// again. Waiters wake earlier when the holder releases or its lease
    /// ends, so this only bounds the cost of a lost wake-up. A park that
    /// ends at this time (not at a deadline or a lease end) lasts at least
    /// 100 ms, the server's timer tick, as it did when parks ended on
    /// Redis's timeout. Defaults to 2 s.
    ///
    /// A plain lock's (or multi-lock's) waiter on one server or Sentinel
    /// does not look on its own every `max_park`: the client checks every
    /// such waiter's lock key once per `max_park` with one `EXISTS`, wakes
    /// the waiters whose lock is gone, and the waiters look at their
    /// holder's lease end or after 10 × `max_park`. A lost wake-up is still
    /// noticed within about `max_park`.
    pub fn max_park(mut self, max_park: Duration) -> Self {
        self.max_park = max_park;
        self
    }

    /// How long connecting, one command's reply, and waiting for a pooled
    /// connection may each take before the call fails with
    /// [`Error::Unreachable`] or [`Error::PoolTimeout`]. Defaults to 3 s.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    /// How long an unclaimed baton stays in Redis. Too short and a wake-up is
    /// lost on a busy server (waiters then wait up to `max_park`); it never
    /// leaks either way. Defaults to 5 s.
    pub fn baton_ttl(mut self, ttl: Duration) -> Self {
        self.baton_ttl = ttl;
        self
    }

    /// How long a lock's fencing counter stays in Redis after the lock was
    /// last taken. Tokens are never below the server's clock in
    /// microseconds, so a counter that expires (or that Redis loses or rolls
    /// back) starts again above every token issued before, and a name used
    /// once leaves no key behind for longer than this. At least 1 ms, at
    /// most a year. Defaults to 1 day.
    pub fn fence_counter_ttl(mut self, ttl: Duration) -> Self {
        self.fence_counter_ttl = ttl;
        self
    }

    /// Trusts `pem` (one or more PEM certificates) as the root for `rediss://`
    /// connections, for a server whose certificate is not signed by a
    /// system-trusted authority (a private CA, or a self-signed certificate).
    /// Without it, the system's root certificates are used.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: &[u8]) -> Self {
        self.tls.root = Some(pem.to_vec());
        self.with_tls()
    }

    /// Presents a client certificate (`cert_pem`, with its private key
    /// `key_pem`, both PEM) on `rediss://` connections, for a server that
    /// authenticates its clients by certificate (`tls-auth-clients yes`,
    /// managed offerings, zero-trust networks). Every connection presents
    /// it: the servers of a cluster, the sentinels and the master they
    /// name, each master of a quorum. A server that refuses the
    /// certificate (or finds none) ends the handshake: the first call fails
    /// with [`Error::Unreachable`] naming the TLS alert.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redbaton::Client::builder("rediss://redis.internal:6380/")
    ///     .tls_root_certificate(&std::fs::read("ca.pem")?)
    ///     .tls_client_certificate(&std::fs::read("client.pem")?, &std::fs::read("client.key")?)
    ///     .build()?;
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        self.tls.client = Some((cert_pem.to_vec(), key_pem.to_vec()));
        self.with_tls()
    }

    /// Makes every URL's client anew with the TLS settings given so far
    /// (each call of redis-rs's `build_with_tls` replaces the last).
    #[cfg(feature = "tls")]
    fn with_tls(mut self) -> Self {
        let tls = self.tls.clone();
        self.topology = self.topology.map_clients(|client| {
            redis::Client::build_with_tls(
                client.get_connection_info().clone(),
                redis::TlsCertificates {
                    client_tls: tls.client.clone().map(|(client_cert, client_key)| {
                        redis::ClientTlsConfig {
                            client_cert,
                            client_key,
                        }
                    }),
                    root_cert: tls.root.clone(),
                },
            )
        });
        self
    }

    /// For tests only, not part of the API: a client behind Sentinel that
    /// does not follow `+switch-master` events, so that tests can check
    /// that it finds a new master by itself (after a failed connection, a
    /// `READONLY` reply). No effect on other deployments.
    #[doc(hidden)]
    pub fn without_switch_events_for_tests(mut self) -> Self {
        self.follow_switches = false;
        self
    }

    /// How many times in a row a releasing thread may hand the lock straight
    /// to a waiting thread of the same client (no baton, no round trip for
    /// the waiter) before it must release it in Redis, where waiters of
    /// other processes get their turn; a run also ends after
    /// [`max_local_run`](ClientBuilder::max_local_run). 0 turns local
    /// hand-off off; at most 1,000,000. Defaults to 64.
    ///
    /// A plain lock's hand-off to a waiter asking for the same renewed
    /// lease sends nothing to Redis: the ownership passes in memory under
    /// the next fencing token. So each ownership taken in Redis sets this
    /// many tokens aside in the lock's fencing counter, and tokens from
    /// Redis grow by at least this much more than one per acquisition.
    pub fn max_local_handoffs(mut self, count: u32) -> Self {
        self.max_local_handoffs = count;
        self
    }

    /// How long a run of hand-offs to threads of the same client (see
    /// [`max_local_handoffs`](ClientBuilder::max_local_handoffs)) may go
    /// on, counted from its first hand-off: the first release after it
    /// goes through Redis, where waiters of other processes get their
    /// turn. So a waiter of another process waits for a process's run at
    /// most this, one critical section and `max_local_handoffs` hand-offs,
    /// whichever ends it first. A plain lock's release in Redis goes to the
    /// waiter of another process that has waited longest, so the processes
    /// take turns. Between 1 ms and a year. Defaults to 2 ms:
    /// short critical sections are handed on by the dozen, long ones pass
    /// through Redis every time or two.
    pub fn max_local_run(mut self, run: Duration) -> Self {
        self.max_local_run = run;
        self
    }

    /// Asks `replicas` replicas to confirm every write that makes or
    /// extends an ownership (acquisition, renewal, `extend`, hand-off):
    /// the lock's master answers `WAIT replicas timeout` first. With fewer
    /// confirmations, the write counts as not done: a fresh acquisition is
    /// undone and the waiter tries again within its deadline (the error,
    /// when it runs out, is [`Error::NotReplicated`]); an unconfirmed
    /// hand-off is undone the same way. A last release is confirmed too:
    /// one the replicas did not confirm returns the error and is sent again
    /// in the background, to whichever master is current after a failover,
    /// until it is confirmed there or its lease is over, so that a lock
    /// released just before a failover is free on the new master. A rate
    /// limiter's grant is confirmed too (an unconfirmed one is
    /// `NotReplicated`, its permits taken: fewer granted, never more). An
    /// unconfirmed renewal or `extend`
    /// is logged as a warning but stands: the master has the longer lease,
    /// and giving it up would strand the lock there. A lock confirmed this
    /// way survives the failover of its master to any of those replicas,
    /// which asynchronous replication alone does not promise. `timeout`
    /// must be shorter than `io_timeout`.
    /// Off by default; each acquisition then costs one round trip to a
    /// replica more.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = Some(ReplicaAcks { replicas, timeout });
        self
    }

    /// With `Topology::masters` (feature `redlock`): how long one master
    /// may take to answer before it counts as "not there" for that round
    /// (connect, reply and pool wait), for every lock whatever its lease.
    /// Small against the lease, since every round must end well within it.
    /// By default each round takes 1 % of the lease it is about (the lock's
    /// fixed lease, or `default_lease`), at least 50 ms and at most
    /// `io_timeout`. A master that did not answer in time is left out of
    /// the next rounds, while the others make a majority, until it answers
    /// a probe sent in the background.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// With `Topology::masters` (feature `redlock`): how much the masters'
    /// clocks and this process's may disagree about a lease, as
    /// `ratio × lease + fixed`. A quorum lock counts as held only while
    /// `lease − elapsed − drift` is left, and its guard's
    /// [`valid_until`](crate::LockGuard::valid_until) ends that much before
    /// the lease would by this clock. `ratio` between 0 and 0.5, `fixed`
    /// at most a year. Defaults to 1 % + 2 ms, as the Redis documentation's
    /// Redlock. Other topologies have one clock per lock and ignore it.
    pub fn clock_drift(mut self, ratio: f64, fixed: Duration) -> Self {
        self.clock_drift = Some((ratio, fixed));
        self
    }

    /// Calls `hook` with every [`Event`] of the client: acquisitions (how,
    /// after how long), releases, losses (with their [`LostReason`]),
    /// renewals that failed, releases finished in the background, waits,
    /// and what the deployment did (a cluster's slot map reloaded, a
    /// sentinel's new master, a Redlock master left out and back). Unset
    /// by default: the client then makes no event at all, and logs (with
    /// `log`) as it always does, hook or not.
    ///
    /// The hook runs on the thread where the event happens (a caller's, or
    /// the client's watchdog, sentinel or probe thread), never while the
    /// client holds a lock of its own, so it may use the client; it should
    /// be quick (count, send on a channel), since that thread waits for it.
    /// A panic of the hook is caught (and logged once): the client goes on.
    /// Each call adds a hook: they are called in the order they were added
    /// (after or before the sinks that `metrics` and `tracing`, the methods
    /// of the features of those names, add, as the calls come).
    ///
    /// [`LostReason`]: crate::LostReason
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use redbaton::Event;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let losses = Arc::new(AtomicU64::new(0));
    /// let counted = Arc::clone(&losses);
    /// let client = redbaton::Client::builder("redis://127.0.0.1/")
    ///     .on_event(move |event| {
    ///         if let Event::Lost { name, reason, .. } = event {
    ///             counted.fetch_add(1, Ordering::Relaxed);
    ///             eprintln!("lost {name}: {reason}");
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_event(mut self, hook: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.observer = self.observer.with(Arc::new(hook));
        self
    }

    /// Records the client's events with the [`metrics`](::metrics) crate's
    /// recorder (the one installed when an event happens): counters of
    /// acquisitions, contended acquisitions, timeouts, losses, failed
    /// renewals and releases finished in the background; histograms of
    /// wait and hold times (seconds); gauges of waiting threads and of
    /// holds. The metrics are named in the guide, "Observing a client";
    /// each is labelled with the `kind` of hold where there is one, and
    /// with the synchronizer's `name` only when `names_as_labels` is true
    /// (names may be unbounded, and each makes a series). Adds a hook, as
    /// [`on_event`](ClientBuilder::on_event) does; describes the metrics
    /// (with their units) to the recorder installed now.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// // With a recorder installed (metrics-exporter-prometheus, ...).
    /// let client = redbaton::Client::builder("redis://127.0.0.1/")
    ///     .metrics(false)
    ///     .build()?;
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, names_as_labels: bool) -> Self {
        crate::sinks::metrics::describe();
        self.on_event(crate::sinks::metrics::sink(names_as_labels))
    }

    /// Tells the client's events to the [`tracing`](::tracing) crate's
    /// subscriber, as events of target `redbaton` with the event's fields
    /// (`name`, `kind`, `waited`, `held`, `fencing_token`, `how`,
    /// `reason`): a loss at `WARN`; a failed renewal, a background
    /// release, a timeout, a failed acquisition and what the deployment
    /// did at `INFO`; an acquisition, a release and the waits at `DEBUG`.
    ///
    /// Each acquisition (of a lock, fair lock, read or write hold, or
    /// permits; a latch's wait is none) is also one span `acquire` of
    /// target `redbaton` at `INFO`, with fields `name`, `kind`, `outcome`
    /// (`acquired`, `timed_out` or `failed`), `waited_ms` (the event's
    /// `waited`, in milliseconds), and `fencing_token` and `how` when
    /// acquired. A span opens when the caller's thread starts waiting and
    /// closes at the outcome, with the wait's events inside it; an
    /// acquisition that did not wait opens and closes its span at its
    /// outcome. A `try_*` call that finds the object taken and does not
    /// wait (`try_lock`, `try_acquire`, ...) makes none. Spans are
    /// children of the span current on the caller's thread. Adds a hook,
    /// as [`on_event`](ClientBuilder::on_event) does.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let client = redbaton::Client::builder("redis://127.0.0.1/")
    ///     .tracing()
    ///     .build()?;
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn tracing(self) -> Self {
        self.on_event(crate::sinks::tracing::sink)
    }

    /// Checks the settings and makes the client. Does not connect.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL that does not parse,
    /// [`Error::InvalidLease`] for a default lease under 1 ms or over a year,
    /// [`Error::InvalidConfig`] for any other setting out of range.
    pub fn build(self) -> Result<Client, Error> {
        let invalid = |source| Error::InvalidUrl { source };
        let node_timeout = NodeTimeout {
            fixed: self.node_timeout,
            io_timeout: self.io_timeout,
        };
        let clock_drift = match self.clock_drift {
            None => ClockDrift::DEFAULT,
            Some((ratio, fixed)) => ClockDrift::new(ratio, fixed).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "clock_drift ratio is {ratio}; it must be between 0 and {MAX_DRIFT_RATIO}"
                ))
            })?,
        };
        #[cfg_attr(not(feature = "redlock"), allow(unused_mut))]
        let mut config = Config {
            prefix: self.prefix,
            client_name: self.client_name.unwrap_or_else(default_client_name).into(),
            pool_size: self.pool_size,
            parking_connections: self.parking_connections,
            default_lease: self.default_lease,
            max_park: self.max_park,
            io_timeout: self.io_timeout,
            baton_ttl: self.baton_ttl,
            fence_ttl: self.fence_counter_ttl,
            max_local_handoffs: self.max_local_handoffs,
            max_local_run: self.max_local_run,
            replica_acks: self.replica_acks,
            node_timeout,
            clock_drift,
            observer: self.observer,
        };
        #[cfg(feature = "redlock")]
        if let Form::Masters(_) = &self.topology.form {
            // The masters' clocks may disagree, so the clock floor of a
            // token does not order tokens across majorities: only counters
            // that outlive every holder do (a year: never, in practice).
            config.fence_ttl = crate::config::MAX_LEASE;
        }
        config.validate()?;
        let trace = scripts::command_in_error;
        // The client's id, in its threads' identities and its grant
        // channel's name.
        let instance = uuid::Uuid::new_v4();
        // Releases may grant a waiter what it waits for where one server's
        // word is final: not under `replica_acks`, whose writes count only
        // once confirmed (see `backend::grants`).
        let grants = config
            .replica_acks
            .is_none()
            .then(|| Arc::new(Grants::new(&config.prefix, &instance.to_string())));
        let backend = Arc::new(match self.topology.form {
            Form::Server(server) => {
                Backend::single(server.map_err(invalid)?, &config, trace, grants)
            }
            #[cfg(feature = "cluster")]
            Form::Cluster(seeds) => Backend::cluster(seeds.map_err(invalid)?, &config, trace),
            #[cfg(feature = "sentinel")]
            Form::Sentinel {
                service,
                sentinels,
                master,
            } => {
                let sentinels = sentinels.map_err(invalid)?;
                let master = master.transpose().map_err(invalid)?;
                let follow = self.follow_switches;
                Backend::sentinel(service, sentinels, master, &config, trace, follow, grants)
            }
            #[cfg(feature = "redlock")]
            Form::Masters(masters) => {
                let masters = masters.map_err(invalid)?;
                check_masters(&masters)?;
                // Each master's own exchanges (connects, parks, script
                // loads) are bounded by the node timeout of the default
                // lease; rounds set their own, from their lease.
                let node_config = Config {
                    io_timeout: config.node_timeout.for_lease(config.default_lease),
                    ..config.clone()
                };
                Backend::quorum(
                    &config,
                    masters
                        .into_iter()
                        .map(|master| Arc::new(Backend::single(master, &node_config, trace, None)))
                        .collect(),
                )
            }
        });
        let lock_raw: Arc<dyn RawLock> = match backend.masters() {
            #[cfg(feature = "redlock")]
            Some(_) => Arc::new(QuorumLock::new(&backend, &config)),
            _ => Arc::new(DeploymentLock::new(Arc::clone(&backend), &config)),
        };
        let context = Context::new(config, backend, instance);
        Ok(Client::new(Arc::new(context), lock_raw))
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("ClientBuilder");
        f.field("topology", &self.topology)
            .field("prefix", &self.prefix)
            .field("client_name", &self.client_name)
            .field("pool_size", &self.pool_size)
            .field("parking_connections", &self.parking_connections)
            .field("default_lease", &self.default_lease)
            .field("max_park", &self.max_park)
            .field("io_timeout", &self.io_timeout)
            .field("baton_ttl", &self.baton_ttl)
            .field("fence_counter_ttl", &self.fence_counter_ttl)
            .field("max_local_handoffs", &self.max_local_handoffs)
            .field("max_local_run", &self.max_local_run)
            .field("replica_acks", &self.replica_acks)
            .field("node_timeout", &self.node_timeout)
            .field("clock_drift", &self.clock_drift)
            .field("on_event", &self.observer);
        // Whether certificates were given; never their bytes (a key).
        #[cfg(feature = "tls")]
        f.field("tls_root_certificate", &self.tls.root.is_some())
            .field("tls_client_certificate", &self.tls.client.is_some());
        f.finish()
    }
}

/// An odd number of masters, at least three, each once.
#[cfg(feature = "redlock")]
fn check_masters(masters: &[redis::Client]) -> Result<(), Error> {
    let addrs: Vec<String> = masters
        .iter()
        .map(|m| m.get_connection_info().addr().to_string())
        .collect();
    if addrs.len() < 3 || addrs.len().is_multiple_of(2) {
        return Err(Error::InvalidConfig(format!(
            "a quorum needs an odd number of masters, at least 3; {} given",
            addrs.len()
        )));
    }
    for (i, addr) in addrs.iter().enumerate() {
        if addrs[..i].contains(addr) {
            return Err(Error::InvalidConfig(format!(
                "master {addr} is given twice: a quorum needs independent masters"
            )));
        }
    }
    Ok(())
}

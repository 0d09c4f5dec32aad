//! [`LockClient`], its builder, and the state its locks share.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;

use crate::error::{breaks_connection, describe_io, Error};
use crate::identity::Identities;
use crate::keys::{self, LimiterKeys, LockKeys};
use crate::local_queue::LocalQueues;
use crate::lock::Lock;
use crate::ownership::Ownerships;
use crate::pool::{Pool, PooledConn};
use crate::rate_limit::RateLimiter;
use crate::wait::WaitSettings;
use crate::watchdog::{Watchdog, WatchdogStats};

/// The longest lease accepted: one year. Longer leases are almost surely a
/// unit mistake, and a lock that outlives its holder that long is a stuck
/// lock.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A connection to one Redis server, from which [`Lock`]s are made.
///
/// Cheap to clone (an `Arc`); clones share the connection pools, the thread
/// identities and the local wait queues. `Send + Sync`: share one client
/// between all threads of a process.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::LockClient::open("redis://127.0.0.1/")?;
/// let lock = client.lock("inventory:001")?;
/// let guard = lock.lock()?;
/// // ... the critical section ...
/// guard.unlock()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<Shared>,
}

/// What every [`Lock`] of one client needs.
pub(crate) struct Shared {
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) baton_ttl: Duration,
    /// How long a lock's fencing counter lives without use.
    pub(crate) fence_ttl: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) wait: WaitSettings,
    /// Short commands: scripts, `INCR`, `EXISTS`. Each is held for one round
    /// trip, never while waiting.
    pub(crate) commands: Pool,
    /// Connections parked in `BLPOP`; kept apart so that waiters can never
    /// take the connection a releasing holder needs.
    pub(crate) parking: Pool,
    pub(crate) identities: Identities,
    pub(crate) queues: LocalQueues,
    pub(crate) ownerships: Ownerships,
    pub(crate) watchdog: Watchdog,
    /// Numbers requests that may create an ownership (see `next_request`).
    requests: AtomicU64,
    memory_policy_checked: AtomicBool,
}

impl Shared {
    /// Runs one exchange on a command connection, for lock `name`; see
    /// [`Shared::exchange`].
    pub(crate) fn run<T>(
        &self,
        name: &str,
        exchange: impl FnMut(&mut redis::Connection) -> RedisResult<T>,
    ) -> Result<T, Error> {
        self.exchange(name, exchange)
            .map(|sent| sent.value)
            .map_err(|failed| failed.error)
    }

    /// Runs one exchange on a command connection, for lock `name`.
    ///
    /// A pooled connection can be dead without anyone knowing: the server
    /// closed it after its `timeout`, a proxy or NAT dropped it, an operator
    /// ran `CLIENT KILL`. When the exchange finds its connection dropped, it
    /// is sent once more on a fresh one; every exchange of this crate is
    /// safe to send twice (the scripts set depths from their arguments and
    /// check owners and tokens), and [`Sent::resent`] tells the caller that
    /// the first send may have taken effect. A timeout is not resent: the
    /// server may be busy running it, and a second copy could only queue
    /// behind the first.
    pub(crate) fn exchange<T>(
        &self,
        name: &str,
        mut exchange: impl FnMut(&mut redis::Connection) -> RedisResult<T>,
    ) -> Result<Sent<T>, Failed> {
        let not_sent = |error| Failed {
            error,
            outcome_unknown: false,
        };
        let mut resent = false;
        loop {
            let mut conn = self.commands.get(self.io_timeout).map_err(not_sent)?;
            self.check_memory_policy_once(&mut conn);
            match conn.run(&mut exchange) {
                Ok(value) => return Ok(Sent { value, resent }),
                Err(err) if err.is_connection_dropped() && !resent => {
                    log::debug!(
                        "redbaton: a pooled connection was dropped ({}); sending again on a fresh one",
                        describe_io(&err)
                    );
                    resent = true;
                }
                Err(err) => {
                    return Err(Failed {
                        outcome_unknown: breaks_connection(&err),
                        error: Error::from_redis(err, name, self.commands.addr()),
                    })
                }
            }
        }
    }

    /// Warns once per client when the server may evict lock keys: under
    /// memory pressure a `volatile-*` or `allkeys-*` policy deletes a held
    /// lock, and another client can take it while its holder still works.
    /// `CONFIG GET` may be refused (ACL, managed services); that is no error.
    fn check_memory_policy_once(&self, conn: &mut PooledConn) {
        if self.memory_policy_checked.swap(true, Ordering::Relaxed) {
            return;
        }
        let policy: RedisResult<Vec<String>> = conn.run(|c| {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query(c)
        });
        match policy.as_deref() {
            Ok([_, policy]) if policy != "noeviction" => log::warn!(
                "redbaton: Redis at {} has maxmemory-policy {policy}: when it reaches maxmemory it may \
                 evict a held lock, and another client can then take it while its holder still works \
                 (a renewed guard reports is_lost() at its next renewal). Use noeviction, or a Redis \
                 that holds nothing but locks",
                self.commands.addr()
            ),
            Ok(_) => {}
            Err(err) => log::debug!(
                "redbaton: cannot read maxmemory-policy ({}); not checked",
                describe_io(err)
            ),
        }
    }

    /// The calling thread's identity under this client.
    pub(crate) fn identity(&self) -> Result<Arc<str>, Error> {
        self.identities
            .current(|counter| self.run("", |c| redis::cmd("INCR").arg(counter).query(c)))
    }

    /// A number for one request that may create an ownership, unique within
    /// this client: it lets an ownership whose reply was lost be found and
    /// undone.
    pub(crate) fn next_request(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A successful exchange.
pub(crate) struct Sent<T> {
    pub(crate) value: T,
    /// The first send failed on a dropped connection and this is the reply
    /// to the second: the first may have run too.
    pub(crate) resent: bool,
}

/// A failed exchange.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: Error,
    /// The command may have reached Redis and run, with its reply lost (a
    /// timeout or a dropped connection after sending).
    pub(crate) outcome_unknown: bool,
}

impl LockClient {
    /// Makes a client for the Redis at `url` with every setting at its
    /// default. Does not connect: the first lock call does.
    ///
    /// `url` is `redis://[user:password@]host[:port][/db]` (or
    /// `redis+unix:///path`).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when `url` cannot be parsed.
    pub fn open(url: &str) -> Result<LockClient, Error> {
        LockClient::builder(url).build()
    }

    /// Starts a [`LockClientBuilder`] for the Redis at `url`.
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder::new(url)
    }

    /// A handle on the lock called `name`. Cheap; makes no network call.
    ///
    /// Any non-empty UTF-8 string is a valid name: braces, colons, spaces and
    /// emoji included.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty.
    pub fn lock(&self, name: &str) -> Result<Lock, Error> {
        let keys = LockKeys::new(&self.shared.prefix, name)?;
        Ok(Lock::new(Arc::clone(&self.shared), keys))
    }

    /// A handle on the rate limiter called `name`. Cheap; makes no network
    /// call. Its rate is stored in Redis: set it with
    /// [`RateLimiter::set_rate`] before acquiring.
    ///
    /// Names follow the rules of lock names, and a limiter never shares keys
    /// with a lock of the same name. In [`RateMode::PerClient`] mode, this
    /// client's budget is its own, apart from every other client's.
    ///
    /// [`RateMode::PerClient`]: crate::RateMode::PerClient
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty.
    pub fn rate_limiter(&self, name: &str) -> Result<RateLimiter, Error> {
        let keys = LimiterKeys::new(&self.shared.prefix, name, self.shared.identities.instance())?;
        Ok(RateLimiter::new(Arc::clone(&self.shared), keys))
    }

    /// What the watchdog has done so far: renewal rounds (one round trip
    /// each), leases renewed, and locks found lost.
    pub fn watchdog_stats(&self) -> WatchdogStats {
        self.shared.watchdog.stats()
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("addr", &self.shared.commands.addr())
            .field("prefix", &self.shared.prefix)
            .field("instance", &self.shared.identities.instance())
            .finish_non_exhaustive()
    }
}

/// Settings of a [`LockClient`]; every setter documents its default.
///
/// Bad values are reported by [`build`](LockClientBuilder::build), not by the
/// setters.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::LockClient::builder("redis://127.0.0.1/")
///     .prefix("billing")
///     .pool_size(4)
///     .default_lease(Duration::from_secs(10))
///     .build()?;
/// # Ok(())
/// # }
/// ```
pub struct LockClientBuilder {
    /// Parsed at once, reported by `build`; the URL text itself is not kept,
    /// so no password can end up in `Debug` output.
    client: RedisResult<redis::Client>,
    prefix: String,
    pool_size: u32,
    parking_connections: u32,
    default_lease: Duration,
    max_park: Duration,
    io_timeout: Duration,
    baton_ttl: Duration,
    fence_counter_ttl: Duration,
    max_local_handoffs: u32,
}

impl LockClientBuilder {
    fn new(url: &str) -> Self {
        LockClientBuilder {
            client: redis::Client::open(url),
            prefix: "redbaton".to_owned(),
            pool_size: 8,
            parking_connections: 16,
            default_lease: Duration::from_secs(30),
            max_park: Duration::from_secs(2),
            io_timeout: Duration::from_secs(3),
            baton_ttl: Duration::from_secs(5),
            fence_counter_ttl: Duration::from_secs(24 * 3600),
            max_local_handoffs: 8,
        }
    }

    /// The first segment of every key, so that several applications can share
    /// one Redis. Must be non-empty and contain no `{` or `}`.
    /// Defaults to `"redbaton"`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How many connections carry lock commands (acquire, release, ...).
    /// Each is held for one round trip only, so a few serve many threads.
    /// Defaults to 8.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How many connections may be parked in `BLPOP` at once. A process parks
    /// at most one per lock name it is waiting for, however many of its
    /// threads wait; waiters beyond this limit look again every maximum park
    /// time instead. Defaults to 16.
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
    /// ends, so this only bounds the cost of a lost wake-up. Defaults to 2 s.
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
    pub fn tls_root_certificate(mut self, pem: &[u8]) -> Self {
        self.client = self.client.and_then(|client| {
            redis::Client::build_with_tls(
                client.get_connection_info().clone(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.to_vec()),
                },
            )
        });
        self
    }

    /// How many times in a row a releasing thread may hand the lock straight
    /// to a waiting thread of the same client (no baton, no round trip for
    /// the waiter) before it must release it in Redis, where waiters of
    /// other processes get their turn. 0 turns local hand-off off.
    /// Defaults to 8.
    pub fn max_local_handoffs(mut self, count: u32) -> Self {
        self.max_local_handoffs = count;
        self
    }

    /// Checks the settings and makes the client. Does not connect.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL that does not parse,
    /// [`Error::InvalidLease`] for a default lease under 1 ms or over a year,
    /// [`Error::InvalidConfig`] for any other setting out of range.
    pub fn build(self) -> Result<LockClient, Error> {
        let client = self.client.map_err(|source| Error::InvalidUrl { source })?;
        keys::validate_prefix(&self.prefix)?;
        validate_lease(self.default_lease)?;
        for (what, count) in [
            ("pool_size", self.pool_size),
            ("parking_connections", self.parking_connections),
        ] {
            if count == 0 {
                return Err(Error::InvalidConfig(format!("{what} must be at least 1")));
            }
        }
        for (what, value) in [
            ("max_park", self.max_park),
            ("io_timeout", self.io_timeout),
            ("baton_ttl", self.baton_ttl),
            ("fence_counter_ttl", self.fence_counter_ttl),
        ] {
            if value < Duration::from_millis(1) || value > MAX_LEASE {
                return Err(Error::InvalidConfig(format!(
                    "{what} is {value:?}; it must be between 1 ms and a year"
                )));
            }
        }
        let commands = Pool::new(client.clone(), self.pool_size, self.io_timeout, "command");
        let parking = Pool::new(client, self.parking_connections, self.io_timeout, "parking");
        Ok(LockClient {
            shared: Arc::new(Shared {
                identities: Identities::new(keys::identity_counter(&self.prefix)),
                prefix: self.prefix,
                default_lease: self.default_lease,
                baton_ttl: self.baton_ttl,
                fence_ttl: self.fence_counter_ttl,
                io_timeout: self.io_timeout,
                wait: WaitSettings {
                    max_park: self.max_park,
                    io_timeout: self.io_timeout,
                },
                commands,
                parking,
                queues: LocalQueues::new(self.max_local_handoffs),
                ownerships: Ownerships::default(),
                watchdog: Watchdog::new(),
                requests: AtomicU64::new(0),
                memory_policy_checked: AtomicBool::new(false),
            }),
        })
    }
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = match &self.client {
            Ok(client) => client.get_connection_info().addr().to_string(),
            Err(_) => "<invalid URL>".to_owned(),
        };
        f.debug_struct("LockClientBuilder")
            .field("addr", &addr)
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("parking_connections", &self.parking_connections)
            .field("default_lease", &self.default_lease)
            .field("max_park", &self.max_park)
            .field("io_timeout", &self.io_timeout)
            .field("baton_ttl", &self.baton_ttl)
            .field("fence_counter_ttl", &self.fence_counter_ttl)
            .field("max_local_handoffs", &self.max_local_handoffs)
            .finish()
    }
}

/// A lease is sent as PEXPIRE milliseconds: it must be at least one.
pub(crate) fn validate_lease(lease: Duration) -> Result<(), Error> {
    if lease < Duration::from_millis(1) || lease > MAX_LEASE {
        return Err(Error::InvalidLease { lease });
    }
    Ok(())
}

//! The facade: [`Client`], the one entry point that hands out every
//! synchronizer, and its [`ClientBuilder`] (`builder.rs`).

mod builder;
mod inspect;

use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::error::Error;
use crate::keys::{self, LatchKeys, LimiterKeys, LockKeys, RwKeys, SemaphoreKeys};
use crate::lease::WatchdogStats;
use crate::sync::grants;
use crate::sync::lock::RawLock;
use crate::sync::rwlock::RwProtocol;
use crate::sync::semaphore::{DeploymentSemaphore, RawSemaphore};
use crate::sync::{CountDownLatch, Lock, MultiLock, RateLimiter, RwLock, Semaphore};

pub use builder::{ClientBuilder, Topology};
pub use inspect::{PermitHolder, RwHolders, SyncKind};

/// Keys `SCAN` looks at per call in [`Client::lock_names`]: a few hundred
/// keep each call short on a busy server and the round trips few.
const SCAN_COUNT: u32 = 500;

/// A client of one Redis deployment, from which every synchronizer is
/// made: [`Lock`]s (and fair locks), [`RwLock`]s, [`Semaphore`]s,
/// [`CountDownLatch`]es and [`RateLimiter`]s.
///
/// Cheap to clone (an `Arc`); clones share the connection pools, the thread
/// identities, the local wait queues and the watchdog. `Send + Sync`: share
/// one client between all threads of a process.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("inventory:001")?;
/// let guard = lock.lock()?;
/// // ... the critical section ...
/// guard.unlock()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    context: Arc<Context>,
    /// The lock protocol for this client's deployment.
    lock_raw: Arc<dyn RawLock>,
    /// The read-write lock's protocol, shared by all its handles.
    rw: Arc<RwProtocol>,
    /// The semaphore protocol: one per client, so that the watchdog renews
    /// all of its permits in one round.
    semaphore_raw: Arc<dyn RawSemaphore>,
}

impl Client {
    fn new(context: Arc<Context>, lock_raw: Arc<dyn RawLock>) -> Client {
        grants::give_back_unclaimed_grants(&context);
        let rw = Arc::new(RwProtocol::new(&context));
        let semaphore_raw = Arc::new(DeploymentSemaphore::new(
            Arc::clone(&context.backend),
            &context.config,
        ));
        Client {
            context,
            lock_raw,
            rw,
            semaphore_raw,
        }
    }

    /// Makes a client for the Redis at `url` with every setting at its
    /// default. Does not connect: the first lock call does.
    ///
    /// `url` is `redis://[user:password@]host[:port][/db]` (or
    /// `redis+unix:///path`).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when `url` cannot be parsed.
    pub fn open(url: &str) -> Result<Client, Error> {
        Client::builder(url).build()
    }

    /// Starts a [`ClientBuilder`] for `topology`: a URL for one server.
    pub fn builder(topology: impl Into<Topology>) -> ClientBuilder {
        ClientBuilder::new(topology)
    }

    /// A handle on the lock called `name`. Cheap; makes no network call.
    ///
    /// Any non-empty UTF-8 string of at most 4096 bytes is a valid name:
    /// braces, colons, spaces and emoji included.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty or too long.
    pub fn lock(&self, name: &str) -> Result<Lock, Error> {
        let keys = LockKeys::new(&self.context.config.prefix, name)?;
        Ok(Lock::new(
            Arc::clone(&self.context),
            Arc::clone(&self.lock_raw),
            keys,
        ))
    }

    /// A handle on the plain locks called `names`, taken all or none: see
    /// [`MultiLock`] and `docs/multi-lock.md`. Names are deduplicated and
    /// their order does not matter. Cheap; makes no network call.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when a name is empty or too long, or when
    /// there is none.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let pair = client.multi_lock(["inventory:001", "inventory:002"])?;
    /// let guard = pair.lock()?; // both, released together on drop
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn multi_lock<S: AsRef<str>>(
        &self,
        names: impl IntoIterator<Item = S>,
    ) -> Result<MultiLock, Error> {
        let locks = MultiLock::unique_names(names)?
            .iter()
            .map(|name| self.lock(name))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MultiLock::new(Arc::clone(&self.context), locks))
    }

    /// A handle on the fair lock called `name`: a [`Lock`] with the same
    /// API, whose acquisitions across every process follow arrival order.
    /// Cheap; makes no network call.
    ///
    /// Waiters queue in Redis (arrival order, each keeping its place alive
    /// at every park slice, so a dead waiter's place ends within about one
    /// slice and never blocks the queue), and a release wakes exactly the
    /// next waiter, on a list of its own: no thundering herd, no barging.
    /// Each waiting thread parks a connection of its own, and there is no
    /// local hand-off (it would let a thread of this process pass a waiter
    /// of another). A fair lock never shares keys with the plain lock of
    /// the same name.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty or too long;
    /// [`Error::WrongTopology`] on a Redlock quorum (`Topology::masters`),
    /// where the fair lock is not offered.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let turnstile = client.fair_lock("batch:turnstile")?;
    /// let guard = turnstile.lock()?; // after everyone who asked before
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fair_lock(&self, name: &str) -> Result<Lock, Error> {
        let keys = LockKeys::fair(&self.context.config.prefix, name)?;
        if self.context.backend.masters().is_some() {
            return Err(Error::WrongTopology {
                addr: self.context.backend.addr().to_owned(),
                detail: "(independent masters of a Redlock quorum) offer the plain lock only, \
                         not the fair lock: make a client of one deployment for it"
                    .to_owned(),
            });
        }
        Ok(Lock::new(
            Arc::clone(&self.context),
            Arc::clone(&self.lock_raw),
            keys,
        ))
    }

    /// A handle on the count-down latch called `name`. Cheap; makes no
    /// network call.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty or too long.
    pub fn count_down_latch(&self, name: &str) -> Result<CountDownLatch, Error> {
        let keys = LatchKeys::new(&self.context.config.prefix, name)?;
        Ok(CountDownLatch::new(Arc::clone(&self.context), keys))
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
    /// [`Error::InvalidName`] when `name` is empty or too long.
    pub fn rate_limiter(&self, name: &str) -> Result<RateLimiter, Error> {
        let context = &self.context;
        let keys = LimiterKeys::new(&context.config.prefix, name, context.identities.instance())?;
        Ok(RateLimiter::new(Arc::clone(context), keys))
    }

    /// A handle on the read-write lock called `name`: many readers or one
    /// writer at a time, writer-preferring. Cheap; makes no network call.
    ///
    /// Names follow the rules of lock names, and a read-write lock never
    /// shares keys with a lock or limiter of the same name. It needs one
    /// deployment (a server, a cluster, a master behind sentinels): on a
    /// quorum of masters its calls return [`Error::WrongTopology`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty or too long.
    pub fn rw_lock(&self, name: &str) -> Result<RwLock, Error> {
        let keys = RwKeys::new(&self.context.config.prefix, name)?;
        Ok(RwLock::new(Arc::clone(&self.context), &self.rw, keys))
    }

    /// A handle on the counting semaphore called `name`. Cheap; makes no
    /// network call. Its total is stored in Redis: set it with
    /// [`Semaphore::try_set_permits`] before acquiring.
    ///
    /// Names follow the rules of lock names, and a semaphore never shares
    /// keys with a lock or a rate limiter of the same name. A semaphore
    /// needs one deployment: on a client of independent masters
    /// (`Topology::masters`) its calls fail with [`Error::WrongTopology`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] when `name` is empty or too long.
    pub fn semaphore(&self, name: &str) -> Result<Semaphore, Error> {
        let keys = SemaphoreKeys::new(&self.context.config.prefix, name)?;
        Ok(Semaphore::new(
            Arc::clone(&self.context),
            Arc::clone(&self.semaphore_raw),
            keys,
        ))
    }

    /// The names of the plain locks that exist now (held, so their key
    /// exists) whose name matches `pattern`, sorted, each once: for an
    /// operator's listing, not for program logic (a lock may be taken or
    /// freed as the answer arrives).
    ///
    /// `pattern` is a Redis glob (`*`, `?`, `[...]`, `\` to escape) over
    /// the name: `"*"` lists every lock, `"jobs:*"` those whose name starts
    /// with `jobs:`. A name's `%`, `{` and `}` are stored as three
    /// characters each, so a `?` never matches one of them (a `*` does).
    /// Fair locks, read-write locks and the other kinds are not listed:
    /// [`held_names`](Client::held_names) lists every kind.
    ///
    /// It walks the keys with `SCAN` under the client's key prefix: on one
    /// server or a Sentinel's master, that server; on a Cluster, every
    /// master of its slot map; on a Redlock quorum, every master, the names
    /// merged (a name held on any master is listed). `SCAN` visits every
    /// key of the keyspace, a few hundred per call: cheap for an operator,
    /// too slow for a hot path.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// for name in client.lock_names("inventory:*")? {
    ///     if let Some(holder) = client.lock(&name)?.holder()? {
    ///         println!("{name}: held by {:?}", holder.client_name);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Redis failures (the first server that fails ends the walk).
    pub fn lock_names(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let prefix = &self.context.config.prefix;
        let matching = keys::lock_scan_pattern(prefix, pattern);
        let found = self.scan(pattern, &matching)?;
        let mut names: Vec<String> = found
            .iter()
            .filter_map(|key| keys::lock_name_of(prefix, key))
            .collect();
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// What the watchdog has done so far: renewal rounds (one round trip
    /// each), leases renewed, and locks found lost.
    pub fn watchdog_stats(&self) -> WatchdogStats {
        self.context.leases.watchdog.stats()
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.context.backend)
            .field("prefix", &self.context.config.prefix)
            .field("instance", &self.context.identities.instance())
            .finish_non_exhaustive()
    }
}

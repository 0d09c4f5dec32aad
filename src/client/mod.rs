//! The facade: [`Client`], the one entry point that hands out every
//! synchronizer, and its [`ClientBuilder`] (`builder.rs`).

mod builder;

use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::error::Error;
use crate::keys::{LimiterKeys, LockKeys, SemaphoreKeys};
use crate::lease::WatchdogStats;
use crate::sync::lock::RawLock;
use crate::sync::semaphore::{DeploymentSemaphore, RawSemaphore};
use crate::sync::{Lock, RateLimiter, Semaphore};

pub use builder::{ClientBuilder, Topology};

/// A client of one Redis deployment, from which [`Lock`]s and
/// [`RateLimiter`]s are made.
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
    /// The semaphore protocol: one per client, so that the watchdog renews
    /// all of its permits in one round.
    semaphore_raw: Arc<dyn RawSemaphore>,
}

impl Client {
    fn new(context: Arc<Context>, lock_raw: Arc<dyn RawLock>) -> Client {
        let semaphore_raw = Arc::new(DeploymentSemaphore::new(
            Arc::clone(&context.backend),
            &context.config,
        ));
        Client {
            context,
            lock_raw,
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

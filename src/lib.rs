//! A blocking, sync-first distributed lock on Redis.
//!
//! Threads of many processes, on many machines, share one lock through a
//! Redis server. A thread that loses the race does not spin: it parks in
//! `BLPOP` on the lock's notification list, and the thread that releases
//! pushes one token (the *baton*) there, which wakes exactly one waiter.
//!
//! # Quick start
//!
//! ```no_run
//! # fn main() -> Result<(), redbaton::Error> {
//! let client = redbaton::Client::open("redis://127.0.0.1/")?;
//! let lock = client.lock("inventory:001")?;
//!
//! let guard = lock.lock()?; // blocks until acquired
//! let token = guard.fencing_token(); // pass to storage that checks it
//! // ... the critical section ...
//! guard.unlock()?; // or drop it: released on drop, failures logged
//! # let _ = token;
//! # Ok(())
//! # }
//! ```
//!
//! # What holds
//!
//! - **Mutual exclusion** while leases last: the lock is a Redis hash taken
//!   and released by atomic Lua scripts that check the owner.
//! - **Re-entrance**: a thread that holds a lock may take it again; it is free
//!   after as many releases.
//! - **Crash safety**: every acquisition sets a lease (`PEXPIRE`); a holder
//!   that dies frees the lock when its lease ends, and waiters wake then, not
//!   at their next poll. While a guard lives, the client's watchdog thread
//!   renews the lease (or, with [`Lock::with_fixed_lease`], the lock ends on
//!   time); a guard whose lock ran out reports [`LockGuard::is_lost`].
//! - **No busy waiting**: a waiter costs at most a couple of commands per
//!   maximum park time, and a process parks one connection per lock name
//!   however many of its threads wait.
//! - **Order and fast hand-off inside a process**: threads waiting for one
//!   lock queue in arrival order; a releasing thread of the same process
//!   passes the lock to the oldest in its release script (no baton, no round
//!   trip for the waiter), a bounded number of times in a row before
//!   releasing in Redis so that other processes get their turn.
//! - **Fencing tokens** that increase with every fresh acquisition.
//!
//! # Deployments
//!
//! One server (a URL), a Redis Cluster (`Topology::cluster`, feature
//! `cluster`: each lock on its slot's master) or a master watched by
//! Sentinel (`Topology::sentinel`, feature `sentinel`: followed across
//! failovers), or a majority of independent masters (`Topology::masters`,
//! feature `redlock`), with the same API. Replication is asynchronous; with
//! [`ClientBuilder::replica_acks`] a lock is granted only once replicas have
//! it, so that it survives the failover of its master.
//!
//! # Rate limiting
//!
//! The same client also paces calls across processes: a
//! [`RateLimiter`] is a token bucket in Redis, refilled on the server's clock
//! by one Lua script per call, with its rate stored in Redis so that every
//! process agrees on it.
//!
//! ```no_run
//! use std::time::Duration;
//! use redbaton::RateMode;
//! # fn main() -> Result<(), redbaton::Error> {
//! let client = redbaton::Client::open("redis://127.0.0.1/")?;
//! let limiter = client.rate_limiter("partner-api")?;
//! limiter.set_rate(RateMode::Overall, 50, Duration::from_secs(1))?; // first writer wins
//! limiter.acquire(1)?; // sleeps until a permit exists, then takes it
//! # Ok(())
//! # }
//! ```
//!
//! # Semaphores
//!
//! A [`Semaphore`] caps how many holders share something at once, across
//! processes. Its total lives in Redis; each [`SemaphorePermit`] is leased
//! like a lock (renewed while it lives, returned when its process dies),
//! and waiters park in `BLPOP` until a release may serve them.
//!
//! ```no_run
//! # fn main() -> Result<(), redbaton::Error> {
//! let client = redbaton::Client::open("redis://127.0.0.1/")?;
//! let connections = client.semaphore("partner-api:connections")?;
//! connections.try_set_permits(3)?; // first writer wins
//! let permit = connections.acquire()?; // at most 3 at once, across every process
//! // ... call the partner ...
//! permit.release()?;
//! # Ok(())
//! # }
//! ```
//!
//! A single Redis is not safe across failover: a replica promoted before it
//! received the lock can grant it again. See the README for the limits.
//!
//! # How the crate is built
//!
//! Layers, each importing only from those below it: the facade
//! ([`Client`]), the synchronizers (the lock, the rate limiter), the runtime
//! a client's handles share, the wait core and the lease machinery, the Lua
//! scripts and the key layout, the backend that owns every socket, and the
//! settings and errors. Under each synchronizer sits its raw protocol: the
//! Redis exchanges as a trait that returns data, never a guard, so that
//! another deployment (a quorum of masters) is another implementation of
//! it. `ARCHITECTURE.md` in the repository lists every module and where a
//! new synchronizer or backend goes.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// The layers, top to bottom; a module imports only from layers below it
// (see ARCHITECTURE.md): the facade, the synchronizers, the runtime they
// share, the machinery (waiting, leases), the Redis protocol and keys, the
// transport, and the settings and errors everything uses.
mod backend;
mod client;
mod config;
mod context;
mod error;
mod identity;
mod keys;
mod lease;
mod parking;
mod scripts;
mod sync;

pub use client::{Client, ClientBuilder, Topology};
pub use error::Error;
pub use lease::WatchdogStats;
pub use sync::{Holder, Lock, LockGuard, Owner, Rate, RateLimiter, RateMode};
pub use sync::{Semaphore, SemaphorePermit};

/// Compiles the README's examples as doctests, so the front door stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

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
//!   maximum park time, and a process parks every name it waits for on two
//!   connections per server, however many names and threads wait.
//! - **Order and fast hand-off inside a process**: threads waiting for one
//!   lock queue in arrival order; a releasing thread of the same process
//!   passes the lock to the oldest in memory (or to one that has just
//!   queued and is still awake, while the oldest was served within the
//!   last 0.5 ms), with no command at all (the process keeps its
//!   ownership in Redis, and the new holder gets the next fencing token),
//!   a bounded number of times in a row or for a bounded time before
//!   releasing in Redis so that other processes get their turn.
//! - **Fencing tokens** that increase with every fresh acquisition.
//!
//! # One client, every synchronizer
//!
//! A [`Client`] hands out locks ([`Client::lock`]), fair locks
//! ([`Client::fair_lock`]), read-write locks, semaphores, count-down
//! latches and rate limiters, all waiting on the same baton core.
//! [`Client::builder`] takes a [`Topology`]; a URL string is one server.
//! The verbs are shared: locks `lock` / `try_lock` / `try_lock_for` /
//! `try_lock_until` (the read-write lock `read…` and `write…` the same way)
//! and return guards; the semaphore's `acquire` / `acquire_many(k)` and
//! their `try_…` forms return a permit guard. Where nothing is held
//! afterwards, the answer is a `bool` or `()`: the latch's `wait_for`, and
//! the rate limiter's `acquire(n)` / `try_acquire(n)`, which take a permit
//! count and give nothing back (its documented exception to the
//! semaphore's `acquire` / `acquire_many` pair). Contention is never an
//! error: `try_lock*` return `Ok(None)`, `try_acquire*` `Ok(None)` or
//! `Ok(false)`; the errors are one enum, [`Error`].
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
//! received the lock can grant it again. `docs/deployments.md` in the
//! repository says what each deployment can still get wrong.
//!
//! # Observing
//!
//! Every guard and permit has `lost()`: a channel that gets the
//! [`LostReason`] once, when the hold is found lost (a fixed lease's end, a
//! renewal that found the key gone or taken over, Redis unreachable until
//! the lease ended), so that a thread can block or `select!` on the loss
//! instead of polling `is_lost()`; [`Lock::using`] runs a closure with a
//! [`LostSignal`] to check or wait on. [`ClientBuilder::on_event`] sees
//! every [`Event`] of a client: acquisitions (how, after how long),
//! releases, losses, failed renewals, waits, and what the deployment did;
//! with the `metrics` and `tracing` features, `ClientBuilder::metrics` and
//! `ClientBuilder::tracing` add hooks that tell them to those facades.
//! None of this costs anything until asked for; `docs/observe.md` in the
//! repository is the guide.
//!
//! ```no_run
//! # fn main() -> Result<(), redbaton::Error> {
//! let client = redbaton::Client::builder("redis://127.0.0.1/")
//!     .on_event(|event| eprintln!("{event:?}"))
//!     .build()?;
//! let guard = client.lock("leader")?.lock()?;
//! let lost = guard.lost(); // a crossbeam_channel::Receiver<LostReason>
//! // ... lead, looking at `lost` now and then, or select! on it ...
//! # drop(lost);
//! guard.unlock()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Declarative locking
//!
//! With the `macros` feature, an attribute makes a function hold the lock
//! its arguments name for its whole body, and return `Error::Busy` through
//! its own `Result` when someone else holds it:
//! `#[redbaton::locked(client = LOCKS, key = "order:{order_id}", wait = "5s")]`.
//! See `locked` for the options and the rules.
//!
//! # From async code
//!
//! redbaton blocks the calling thread, and a guard belongs to the thread
//! that took it, so async code must neither wait for a lock on a runtime
//! worker nor carry a guard across `.await`. A service that mixes thread
//! workers with a tokio part can hold the lock on a thread of tokio's
//! blocking pool while its async critical section runs:
//!
//! ```rust,ignore
//! async fn with_lock_async<F: Future>(lock: Lock, work: F) -> Result<F::Output, Error> {
//!     let (held_tx, held_rx) = tokio::sync::oneshot::channel();
//!     let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
//!     let holder = tokio::task::spawn_blocking(move || -> Result<(), Error> {
//!         let guard = lock.lock()?;
//!         if held_tx.send(()).is_err() {
//!             return guard.unlock(); // the caller is gone
//!         }
//!         let _ = done_rx.recv(); // held until the async work ends
//!         guard.unlock()
//!     });
//!     if held_rx.await.is_err() {
//!         holder.await.expect("the lock thread panicked")?; // its error
//!         unreachable!();
//!     }
//!     let output = work.await;
//!     drop(done_tx);
//!     holder.await.expect("the lock thread panicked")?;
//!     Ok(output)
//! }
//! ```
//!
//! Each waiting call takes one blocking-pool thread while it waits (tokio
//! grows that pool to 512 by default). The recipe is tested under a
//! multi-thread runtime in the peer crate, so that tokio stays out of
//! redbaton's own builds: `cargo test --manifest-path
//! benches/peers/Cargo.toml --test tokio` (twelve tasks take turns with an
//! `.await` inside the critical section, and a ticker task shows that no
//! runtime worker was blocked).
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
#![cfg_attr(docsrs, feature(doc_cfg))]
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
mod client_name;
mod config;
mod context;
mod error;
mod identity;
mod keys;
mod lease;
#[cfg(feature = "macros")]
mod locked;
mod observe;
mod parking;
mod scripts;
#[cfg(any(feature = "metrics", feature = "tracing"))]
mod sinks;
mod sync;

pub use client::{Client, ClientBuilder, PermitHolder, RwHolders, SyncKind, Topology};
pub use error::Error;
pub use lease::WatchdogStats;
pub use observe::{Acquisition, Event, HoldKind, LostReason, LostSignal};
pub use sync::{CountDownLatch, Holder, Lock, LockGuard, Owner, Rate, RateLimiter, RateMode};
pub use sync::{MultiLock, MultiLockGuard};
pub use sync::{ReadGuard, RwLock, UpgradableReadGuard, WriteGuard};
pub use sync::{Semaphore, SemaphorePermit};

/// Runs a function holding the distributed lock named by its `key`, built
/// from its arguments: `#[redbaton::locked(client = …, key = "order:{order_id}")]`.
///
/// Feature `macros`. The lock is taken before the body runs, and released
/// when the function ends: by its last expression, a `return`, a `?`, or a
/// panic. When the lock cannot be taken the body does not run, and the
/// function returns [`Error::Busy`] (someone else holds it) or the Redis
/// error, converted into its own error type.
///
/// By default the function makes one attempt (`try_lock`) and is busy at
/// once; `wait = "5s"` waits up to that long (`try_lock_for`). Contention
/// is an error here, unlike in the lock API, because the function's
/// `Result` has no other way to say that it did not run.
///
/// # Examples
///
/// ```no_run
/// use std::sync::LazyLock;
/// use redbaton::Client;
///
/// static LOCKS: LazyLock<Client> =
///     LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(redbaton::Error),
///     Declined,
/// }
///
/// impl From<redbaton::Error> for AppError {
///     fn from(error: redbaton::Error) -> Self {
///         AppError::Lock(error)
///     }
/// }
///
/// /// One payment per order at a time, across every process: one attempt.
/// #[redbaton::locked(client = LOCKS, key = "order:{order_id}")]
/// fn pay(order_id: u64, amount: u64) -> Result<u64, AppError> {
///     if amount == 0 {
///         return Err(AppError::Declined); // releases the lock, like any return
///     }
///     Ok(amount) // charge, record, ...
/// }
///
/// /// Waits up to 5 s for the lock; a renewed 30 s lease; the fencing
/// /// token of this ownership as `token`.
/// #[redbaton::locked(client = LOCKS, key = "report:{day}", wait = "5s", lease = "30s", fencing = token)]
/// fn build_report(day: &str) -> Result<(), AppError> {
///     println!("building the report of {day} under fencing token {token}");
///     Ok(())
/// }
///
/// fn main() {
///     match pay(7, 100) {
///         Ok(paid) => println!("paid {paid}"),
///         Err(AppError::Lock(error)) if error.is_busy() => println!("order 7 is being paid elsewhere"),
///         Err(other) => println!("failed: {other:?}"),
///     }
///     build_report("2024-06-01").expect("the report was built");
/// }
/// ```
///
/// Several names at once, all or none (a multi-lock; see
/// `docs/multi-lock.md`): a transfer holds both accounts, and two
/// transfers that share an account never run together.
///
/// ```no_run
/// # use std::sync::LazyLock;
/// # use redbaton::Client;
/// # static LOCKS: LazyLock<Client> =
/// #     LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));
/// #[redbaton::locked(client = LOCKS, keys = ["account:{from}", "account:{to}"], wait = "5s", fencing = tokens)]
/// fn transfer(from: u64, to: u64, amount: u64) -> Result<(), redbaton::Error> {
///     let [from_token, to_token]: [u64; 2] = tokens; // in the order of `keys`
///     println!("moving {amount} under tokens {from_token} and {to_token}");
///     Ok(())
/// }
/// # fn main() {}
/// ```
///
/// Methods work, and anything in reach can give the client or the key:
///
/// ```no_run
/// # #[derive(Debug)]
/// # struct AppError;
/// # impl From<redbaton::Error> for AppError {
/// #     fn from(_: redbaton::Error) -> Self { AppError }
/// # }
/// struct Accounts {
///     locks: redbaton::Client,
///     region: String,
/// }
///
/// impl Accounts {
///     #[redbaton::locked(client = self.locks, key = { format!("{}:account:{}", self.region, id) })]
///     fn close(&self, id: u64) -> Result<(), AppError> {
///         Ok(())
///     }
/// }
/// ```
///
/// # Options
///
/// | option | meaning |
/// |---|---|
/// | `client = EXPR` | Required. The [`Client`]: any expression that gives one by reference (`&(EXPR)` must coerce to `&Client`): a static `Client` or `LazyLock<Client>`, an `Arc<Client>`, an argument, `self.locks`, a function call. |
/// | `key = "…{arg}…"` | Required (this or the next). The lock's name, a `format!` string whose `{…}` capture the function's arguments by name (`{order_id}`, `{day:?}`, `self` included); a name that is not an argument, or a positional `{}`, is a compile error at the literal (use `key = { … }` for fields and constants). |
/// | `key = { … }` | The lock's name from any expression (a `String`, `&str`, `Cow<str>`, `Box<str>` or `Arc<str>`): fields of `self`, constants, computed names. |
/// | `keys = ["account:{from}", "account:{to}"]` | Instead of `key`: holds the [`MultiLock`] over every name of the list ([`Client::multi_lock`]), all or none; each element a template checked as `key`'s, or an expression. Busy ([`Error::Busy`], whose `name` lists the set's names joined by `", "`) when any name is held elsewhere, and then none of them is held. `key` with `keys`, `keys = []`, and `fair`, `rw` or `semaphore` with `keys` are compile errors. `fencing = name` binds a `[u64; N]`: each name's token, in the order of `keys`. |
/// | `wait = "5s"` | Wait up to this long for the lock ([`Lock::try_lock_for`]), then return [`Error::Busy`]. Without it: one attempt ([`Lock::try_lock`]). |
/// | `lease = "30s"` | A renewed lease of this length ([`Lock::with_lease`]): renewed every third of it while the function runs; a crashed holder frees the lock within it. Without it: the client's `default_lease`. |
/// | `fixed_lease = "30s"` | A fixed lease ([`Lock::with_fixed_lease`]): the lock ends after it even if the function still runs. Excludes `lease`. |
/// | `fencing = name` | Binds the ownership's fencing token ([`LockGuard::fencing_token`], a `u64`) to the local `name`, for the body to pass to storage (the lock, the fair lock and `rw = write`). A plain name that does not hide an argument. |
/// | `fair` | Holds the fair lock of that name ([`Client::fair_lock`]): callers are served in arrival order. |
/// | `rw = read` or `rw = write` | Holds the read-write lock of that name ([`Client::rw_lock`]) for reading (shared) or writing (alone). `lease` is refused (it is renewed with the client's `default_lease`); `fixed_lease` applies. |
/// | `semaphore` or `semaphore = N` | Holds 1 (or N) permits of the semaphore of that name ([`Client::semaphore`]): [`Error::Busy`] when they are not free within the attempt or the `wait`. Its total is set elsewhere ([`Semaphore::try_set_permits`]), else [`Error::SemaphoreNotSet`]. `lease` and `fencing` are refused; `fixed_lease` applies. |
/// | `crate = path` | Where redbaton is, when it is renamed or re-exported (`crate = ::infra::redbaton`). Defaults to `::redbaton`. |
///
/// Durations are a whole number and a unit, `"250ms"`, `"5s"`, `"2m"` or
/// `"1h"`, read at compile time: a malformed one, a zero `wait`, or a
/// lease outside 1 ms to a year is a compile error at the literal. So is
/// an option given twice, or one that does not exist (the message lists
/// the options), and a missing `client` or `key` (or `keys`). Each compile error
/// points at what to change and says how.
///
/// # The function
///
/// - It returns `Result<T, E>` with `E: From<redbaton::Error>`, written as
///   a path ending in `Result` (`Result<T, E>`, `io::Result<T>`,
///   `AppResult<T>`; `Box<dyn Error + Send + Sync>` works as `E`); anything
///   else is a compile error at the return type, and so is an error type
///   without the `From`.
/// - It is neither `async` (the lock blocks the thread, and its guard
///   cannot cross an `.await`: call the function from `spawn_blocking`)
///   nor `const`.
/// - Free functions, methods (`self`, `&self`, `&mut self`, in trait impls
///   too) and generic functions work, as long as they have a body. The
///   guard is a local taken before the body's first statement, not a
///   closure, so `return` and `?` in the body keep their meaning; the body
///   cannot see or shadow the macro's own locals.
/// - Locks are re-entrant per thread: a locked function may call another
///   on the same key (or take the same lock by hand); the inner call joins
///   the outer ownership and its fencing token.
/// - The guard is released like any [`LockGuard`] dropped: a failed release
///   is logged, not returned (the function's value was already computed).
///
/// # Errors
///
/// Through the function's error type: [`Error::Busy`] when another thread
/// or process held the lock for the attempt (or the whole `wait`): it is
/// [`is_busy`](Error::is_busy), and not
/// [`is_transient`](Error::is_transient), since contention is the lock
/// working;
/// [`Error::InvalidName`] for an empty key or one over 4096 bytes; and the
/// Redis failures of [`Lock::try_lock`].
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
#[doc(inline)]
pub use redbaton_macros::locked;

/// What the code generated by [`locked`] calls. Not public API: it may
/// change in any release.
#[cfg(feature = "macros")]
#[doc(hidden)]
pub mod __private {
    pub use crate::locked::{
        fail, lock, lock_many, FromLockError, Held, HeldMany, Kind, Lease, LockName, LockOptions,
    };
}

/// Compiles the README's examples as doctests, so the front door stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Compiles the examples of the guides in `docs/` as doctests, as the
/// README's are: one item per page, so that a failure names its page. A
/// page whose examples need features is compiled when they are on (CI
/// runs the doctests with all of them).
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../docs/lock.md")]
    struct Lock;
    #[doc = include_str!("../docs/fair-lock.md")]
    struct FairLock;
    // Its last example is `#[redbaton::locked(keys = …)]`.
    #[cfg(feature = "macros")]
    #[doc = include_str!("../docs/multi-lock.md")]
    struct MultiLock;
    #[doc = include_str!("../docs/rwlock.md")]
    struct RwLock;
    #[doc = include_str!("../docs/semaphore.md")]
    struct Semaphore;
    #[doc = include_str!("../docs/latch.md")]
    struct Latch;
    #[doc = include_str!("../docs/rate-limiter.md")]
    struct RateLimiter;
    #[cfg(all(feature = "metrics", feature = "tracing"))]
    #[doc = include_str!("../docs/observe.md")]
    struct Observe;
    #[doc = include_str!("../docs/how-it-works.md")]
    struct HowItWorks;
    #[cfg(all(feature = "cluster", feature = "sentinel", feature = "redlock"))]
    #[doc = include_str!("../docs/deployments.md")]
    struct Deployments;
    #[doc = include_str!("../docs/failures.md")]
    struct Failures;
    #[cfg(feature = "tls")]
    #[doc = include_str!("../docs/security.md")]
    struct Security;
    #[doc = include_str!("../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/development.md")]
    struct Development;
}

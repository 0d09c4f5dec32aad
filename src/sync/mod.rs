//! The user-facing synchronizers, one folder (or file) each: a handle, its
//! guards where something is held, and the raw Redis protocol under them.
//!
//! - `lock/`: the re-entrant mutex ([`Lock`], [`LockGuard`]).
//! - `latch`: the count-down latch ([`CountDownLatch`]); no guard, no
//!   lease: waiters park until a token says the count reached zero.
//! - `rate_limit`: the token bucket ([`RateLimiter`]); no guard and no
//!   parking: it sleeps for the wait the server computes.
//! - `rwlock/`: the read-write lock ([`RwLock`], [`ReadGuard`],
//!   [`WriteGuard`], [`UpgradableReadGuard`]), writer-preferring.
//! - `semaphore/`: the counting semaphore with leased permits
//!   ([`Semaphore`], [`SemaphorePermit`]).
//! - `grants`: what the lock and the semaphore share about grants (a
//!   release that hands what it frees to a parked waiter of another
//!   process): the grant's lease, the waiter's mark, the give-back.
//!
//! A new synchronizer is a new folder here: its raw protocol (scripts in
//! `scripts/<name>/`), its handle and guards, waiting through
//! `parking::WaitingRoom` and keeping leases through `lease`.

pub(crate) mod grants;
pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod rate_limit;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

pub use latch::CountDownLatch;
pub use lock::{Holder, Lock, LockGuard, MultiLock, MultiLockGuard, Owner};
pub use rate_limit::{Rate, RateLimiter, RateMode};
pub use rwlock::{ReadGuard, RwLock, UpgradableReadGuard, WriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};

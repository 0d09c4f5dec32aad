//! The server-side half of the protocol: one Lua script per operation, each
//! run atomically by Redis. The `.lua` files document their KEYS, ARGV and
//! replies; [`redis::Script`] sends them with `EVALSHA` and reloads them when
//! the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

/// Take, re-enter, or report the holder's remaining lease.
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("acquire.lua")));

/// Undo one level; the last level deletes the lock and pushes the baton.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("release.lua")));

/// Administrative release of whoever holds the lock.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("force_unlock.lua")));

/// Owner-checked `PEXPIRE`: the watchdog's renewal and `guard.extend()`.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("renew.lua")));

/// Atomic read of owner, depth, fence and remaining lease.
pub(crate) static HOLDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("holder.lua")));

/// Take permits from a rate limiter's bucket, or say how long until they
/// exist; reads the server's clock, never the client's.
pub(crate) static RATE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rate_acquire.lua")));

/// Write a rate limiter's configuration, when absent or unconditionally.
pub(crate) static RATE_CONFIG: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rate_config.lua")));

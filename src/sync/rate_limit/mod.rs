//! [`RateLimiter`]: a token bucket in Redis that paces every process of an
//! application, on the server's clock.

use std::fmt;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis::ErrorKind;

use crate::context::Context;
use crate::error::Error;
use crate::keys::LimiterKeys;
use crate::lease::confirm;
use crate::parking::ride_out;
use crate::scripts;
use crate::scripts::reply::TakeReply;

mod rate;

use rate::{check_permits, check_rate};
pub use rate::{Rate, RateMode};

/// The longest a blocked [`RateLimiter::acquire`] sleeps before it asks
/// again, so that a rate changed by [`RateLimiter::force_rate`] is seen
/// within this long.
const MAX_NAP: Duration = Duration::from_secs(1);

/// A handle on one distributed rate limiter, made by
/// [`Client::rate_limiter`](crate::Client::rate_limiter).
///
/// A token bucket kept in Redis and updated by one Lua script per call, on
/// the server's clock (`TIME`): clients never send a time, so a client whose
/// clock is wrong, or whose requests are delayed, gets no more than the
/// rate. The rate lives in Redis too, so every process agrees on it: set it
/// once with [`set_rate`](RateLimiter::set_rate) (first writer wins) or
/// replace it with [`force_rate`](RateLimiter::force_rate).
///
/// Cheap to clone, `Send + Sync`: hand clones to threads.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redbaton::RateMode;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let limiter = client.rate_limiter("partner-api")?;
/// limiter.set_rate(RateMode::Overall, 50, Duration::from_secs(1))?;
///
/// limiter.acquire(1)?; // blocks until a permit is free
/// // ... call the partner API ...
/// if limiter.try_acquire(5)? { /* five permits, at once */ }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    context: Arc<Context>,
    keys: Arc<LimiterKeys>,
}

/// What one run of the acquire script granted or refused (its errors are
/// [`Error`]s).
enum Take {
    /// Granted (or, for zero permits, read); `left` whole permits remain.
    Granted { left: u64 },
    /// Refused; the permits will exist after `wait` if no one takes them.
    Refused { wait: Duration },
}

impl RateLimiter {
    pub(crate) fn new(context: Arc<Context>, keys: LimiterKeys) -> RateLimiter {
        RateLimiter {
            context,
            keys: Arc::new(keys),
        }
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Configures the limiter to `permits` per `per` in `mode`, unless it is
    /// configured already: the first writer wins, so every process may call
    /// this at start-up with its default. Returns whether this call wrote
    /// the configuration. One script call.
    ///
    /// The bucket holds `permits` (see [`Rate`]).
    ///
    /// # Errors
    /// [`Error::InvalidRate`] for zero permits or more than 10¹², or an
    /// interval under 1 ms or over a year; Redis failures;
    /// [`Error::WrongType`] when something else is stored under the
    /// configuration key.
    pub fn set_rate(&self, mode: RateMode, permits: u64, per: Duration) -> Result<bool, Error> {
        self.write_rate(mode, permits, per, false)
    }

    /// Replaces the limiter's configuration, whatever it was. Every process
    /// uses the new rate from its next script call; a caller blocked in
    /// [`acquire`](RateLimiter::acquire) sees it within a second. Buckets
    /// are kept: they refill at the new rate and are clipped to the new
    /// capacity. One script call.
    ///
    /// # Errors
    /// As [`set_rate`](RateLimiter::set_rate).
    pub fn force_rate(&self, mode: RateMode, permits: u64, per: Duration) -> Result<(), Error> {
        self.write_rate(mode, permits, per, true).map(|_| ())
    }

    /// The configuration stored in Redis, or `None` when nobody has set one.
    /// One `HMGET`.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the configuration is
    /// damaged (something else wrote there).
    pub fn rate(&self) -> Result<Option<Rate>, Error> {
        let stored: [Option<String>; 3] =
            self.context
                .backend
                .run(&self.keys.config, &self.keys.name, |c| {
                    redis::cmd("HMGET")
                        .arg(&self.keys.config)
                        .arg(&["mode", "permits", "per_us"])
                        .query(c)
                })?;
        let [mode, permits, per_us] = stored;
        if mode.is_none() && permits.is_none() && per_us.is_none() {
            return Ok(None);
        }
        let mode = mode.as_deref().and_then(RateMode::parse);
        let permits = permits.and_then(|p| p.parse::<u64>().ok());
        let per_us = per_us.and_then(|p| p.parse::<u64>().ok());
        match (mode, permits, per_us) {
            (Some(mode), Some(permits), Some(per_us)) => Ok(Some(Rate {
                mode,
                permits,
                per: Duration::from_micros(per_us),
            })),
            (None, _, _) => Err(self.damaged("mode")),
            (_, None, _) => Err(self.damaged("permits")),
            (_, _, None) => Err(self.damaged("per_us")),
        }
    }

    /// Takes `permits` if the bucket holds them now; never waits. One script
    /// call.
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] for zero permits;
    /// [`Error::PermitsOverCapacity`] for more than the bucket can ever hold;
    /// [`Error::RateNotConfigured`] when nobody called
    /// [`set_rate`](RateLimiter::set_rate); Redis failures. An empty bucket
    /// is `Ok(false)`, not an error.
    pub fn try_acquire(&self, permits: u64) -> Result<bool, Error> {
        check_permits(permits)?;
        Ok(matches!(self.attempt(permits)?, Take::Granted { .. }))
    }

    /// Blocks until `permits` are granted.
    ///
    /// A refused call is told by the server how long until the bucket holds
    /// `permits`, sleeps exactly that long (at most a second, so that a rate
    /// changed meanwhile is seen), and asks again: no polling. Alone, a
    /// caller sends one script call per grant plus one per refusal; callers
    /// that compete for one bucket may be refused again when another took the
    /// permits first. Not first-come first-served: a caller that asks for
    /// many permits can be overtaken by callers that ask for few.
    ///
    /// A failing Redis (a failover, a slot migration, `BUSY`) is ridden
    /// out for the client's I/O timeout, then its last error is returned;
    /// [`try_acquire_for`](RateLimiter::try_acquire_for) and
    /// [`try_acquire_until`](RateLimiter::try_acquire_until) ride it out
    /// until their deadline. [`try_acquire`](RateLimiter::try_acquire),
    /// which never waits, reports it at once.
    ///
    /// # Errors
    /// As [`try_acquire`](RateLimiter::try_acquire).
    pub fn acquire(&self, permits: u64) -> Result<(), Error> {
        check_permits(permits)?;
        self.acquire_until(permits, None).map(|_| ())
    }

    /// Like [`acquire`](RateLimiter::acquire), but gives up and returns
    /// `false` when the permits cannot be granted within `timeout`. A
    /// timeout too large to be a point in time means no deadline.
    ///
    /// # Errors
    /// As [`try_acquire`](RateLimiter::try_acquire).
    pub fn try_acquire_for(&self, permits: u64, timeout: Duration) -> Result<bool, Error> {
        check_permits(permits)?;
        self.acquire_until(permits, Instant::now().checked_add(timeout))
    }

    /// Like [`acquire`](RateLimiter::acquire), but gives up at `deadline`
    /// and returns `false`. It gives up at once, without sleeping, when the
    /// server says the permits cannot exist before the deadline at the
    /// current rate.
    ///
    /// # Errors
    /// As [`try_acquire`](RateLimiter::try_acquire).
    pub fn try_acquire_until(&self, permits: u64, deadline: Instant) -> Result<bool, Error> {
        check_permits(permits)?;
        self.acquire_until(permits, Some(deadline))
    }

    /// How many whole permits the bucket holds now (this client's bucket in
    /// [`RateMode::PerClient`]). One script call that changes nothing; the
    /// answer may be stale by the time it arrives.
    ///
    /// # Errors
    /// [`Error::RateNotConfigured`] when nobody called
    /// [`set_rate`](RateLimiter::set_rate); Redis failures.
    pub fn available_permits(&self) -> Result<u64, Error> {
        match self.attempt(0)? {
            Take::Granted { left } => Ok(left),
            Take::Refused { .. } => Err(unexpected_reply()),
        }
    }

    /// Removes the limiter: its configuration, its overall bucket and this
    /// client's bucket. Other clients' per-client buckets expire on their own
    /// once full. Returns whether there was a configuration to remove.
    /// Callers acquiring from it get [`Error::RateNotConfigured`] until
    /// someone sets a rate again. One round trip of two `DEL`s, the
    /// configuration's first: a rate set between them starts with full
    /// buckets, as a new one does. (Not a `MULTI`: an ACL user refused it
    /// would get, from redis-rs, a panic in a debug build.)
    ///
    /// # Errors
    /// Redis failures.
    pub fn delete(&self) -> Result<bool, Error> {
        let (config, _buckets): (u32, u32) =
            self.context
                .backend
                .run(&self.keys.config, &self.keys.name, |c| {
                    redis::pipe()
                        .del(&self.keys.config)
                        .del(&[&self.keys.overall, &self.keys.per_client])
                        .query(c)
                })?;
        Ok(config > 0)
    }

    fn write_rate(
        &self,
        mode: RateMode,
        permits: u64,
        per: Duration,
        replace: bool,
    ) -> Result<bool, Error> {
        let per_us = check_rate(permits, per)?;
        let written: i64 = self
            .context
            .backend
            .run(&self.keys.config, &self.keys.name, |c| {
                scripts::RATE_CONFIG
                    .key(&self.keys.config)
                    .arg(mode.as_str())
                    .arg(permits)
                    .arg(per_us)
                    .arg(if replace { "1" } else { "0" })
                    .invoke(c)
            })?;
        Ok(written == 1)
    }

    /// The first attempt, then sleep-and-retry until granted or `deadline`.
    /// A failing Redis (a failover, a migration, `BUSY`) is ridden out as a
    /// lock's waiter does: until `deadline`, or for the I/O timeout without
    /// one; then its last error is returned.
    fn acquire_until(&self, permits: u64, deadline: Option<Instant>) -> Result<bool, Error> {
        let patience = self.context.config.io_timeout;
        loop {
            let taken = ride_out(deadline, patience, || self.attempt(permits))?;
            let wait = match taken {
                Take::Granted { .. } => return Ok(true),
                Take::Refused { wait } => wait,
            };
            if let Some(deadline) = deadline {
                if Instant::now()
                    .checked_add(wait)
                    .is_none_or(|at| at > deadline)
                {
                    return Ok(false);
                }
            }
            // Bounded by MAX_NAP so that a rate changed by force_rate is
            // seen; the server's wait is never zero for a refusal.
            thread::sleep(wait.min(MAX_NAP));
        }
    }

    /// One run of the acquire script; `permits == 0` only reads.
    ///
    /// Under `replica_acks`, a grant is confirmed with `WAIT` like a lock's
    /// acquisition: a bucket the promoted replica never saw drawn down would
    /// grant the same permits again after a failover. An unconfirmed grant
    /// is [`Error::NotReplicated`] (transient: a waiting caller asks again);
    /// its permits stay taken on the master, so a failover errs towards
    /// granting fewer, never more.
    fn attempt(&self, permits: u64) -> Result<Take, Error> {
        let acks = if permits > 0 {
            self.context.config.replica_acks
        } else {
            None
        };
        let reply: TakeReply = confirm::exchange_confirmed(
            &self.context.backend,
            &self.keys.config,
            &self.keys.name,
            acks,
            |reply| matches!(reply, TakeReply::Granted { .. }),
            |c| {
                scripts::RATE_ACQUIRE
                    .key(&self.keys.config)
                    .key(&self.keys.overall)
                    .key(&self.keys.per_client)
                    .arg(permits)
                    .invoke(c)
            },
        )
        .map(|sent| sent.value)
        .map_err(|failed| failed.error)?;
        let name = || self.keys.name.clone();
        match reply {
            TakeReply::Granted { left } => Ok(Take::Granted { left }),
            TakeReply::Refused { wait } => Ok(Take::Refused { wait }),
            TakeReply::NotConfigured => Err(Error::RateNotConfigured { name: name() }),
            TakeReply::OverCapacity { capacity } => Err(Error::PermitsOverCapacity {
                name: name(),
                permits,
                capacity,
            }),
            TakeReply::Damaged { field } => Err(self.damaged(field)),
        }
    }

    fn damaged(&self, field: &str) -> Error {
        Error::WrongType {
            name: self.keys.name.clone(),
            detail: format!(
                "the rate limiter configuration {} has a missing or malformed {field}",
                self.keys.config
            ),
        }
    }
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &self.keys.name)
            .field("config_key", &self.keys.config)
            .finish_non_exhaustive()
    }
}

fn unexpected_reply() -> Error {
    Error::Redis {
        source: (
            ErrorKind::UnexpectedReturnType,
            "unexpected reply from the rate limiter script",
        )
            .into(),
    }
}

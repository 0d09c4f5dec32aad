//! A limiter's rate: [`RateMode`], [`Rate`], and the checks of what a
//! caller may ask for.

use std::time::Duration;

use crate::config::MAX_LEASE;
use crate::error::Error;

/// The shortest interval a rate may have.
const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// The most permits a rate may have per interval. Bucket state is kept in
/// Lua numbers (doubles); this keeps fractions of a permit well inside their
/// precision.
const MAX_PERMITS: u64 = 1_000_000_000_000;

/// Whose budget a [`RateLimiter`](crate::RateLimiter) spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateMode {
    /// One budget shared by every client of the limiter, in every process.
    Overall,
    /// One budget per [`Client`](crate::Client) instance (per
    /// process, when each process makes one client), each at the full
    /// configured rate.
    PerClient,
}

impl RateMode {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            RateMode::Overall => "overall",
            RateMode::PerClient => "per_client",
        }
    }

    pub(super) fn parse(stored: &str) -> Option<RateMode> {
        match stored {
            "overall" => Some(RateMode::Overall),
            "per_client" => Some(RateMode::PerClient),
            _ => None,
        }
    }
}

/// A limiter's configuration, as stored in Redis: `permits` per `per`, in
/// `mode`. From [`RateLimiter::rate`](crate::RateLimiter::rate).
///
/// The bucket holds `permits`: a limiter left idle for `per` lets a burst of
/// `permits` through at once. For smaller bursts, state the same rate over
/// a shorter interval (5 per 100 ms rather than 50 per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Rate {
    /// Whose budget is spent.
    pub mode: RateMode,
    /// Permits per interval; also the bucket's capacity.
    pub permits: u64,
    /// The interval, to the microsecond.
    pub per: Duration,
}

pub(super) fn check_permits(permits: u64) -> Result<(), Error> {
    if permits == 0 {
        return Err(Error::InvalidPermits { permits });
    }
    Ok(())
}

/// Checks a rate and returns its interval in whole microseconds.
pub(super) fn check_rate(permits: u64, per: Duration) -> Result<u64, Error> {
    let reason = if permits == 0 {
        "a rate needs at least 1 permit per interval"
    } else if permits > MAX_PERMITS {
        "a rate may have at most 10^12 permits per interval"
    } else if per < MIN_INTERVAL {
        "the interval must be at least 1 ms"
    } else if per > MAX_LEASE {
        "the interval must be at most a year"
    } else {
        return u64::try_from(per.as_micros()).map_err(|_| Error::InvalidRate {
            permits,
            per,
            reason: "the interval must be at most a year",
        });
    };
    Err(Error::InvalidRate {
        permits,
        per,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_out_of_range_are_refused() {
        let second = Duration::from_secs(1);
        for (permits, per) in [
            (0, second),
            (MAX_PERMITS + 1, second),
            (1, Duration::ZERO),
            (1, Duration::from_micros(999)),
            (1, MAX_LEASE + Duration::from_secs(1)),
            (1, Duration::MAX),
        ] {
            assert!(
                matches!(check_rate(permits, per), Err(Error::InvalidRate { .. })),
                "{permits} per {per:?}"
            );
        }
        assert_eq!(check_rate(MAX_PERMITS, MIN_INTERVAL).unwrap(), 1_000);
        assert_eq!(
            check_rate(1, MAX_LEASE).unwrap(),
            365 * 24 * 3600 * 1_000_000
        );
    }

    #[test]
    fn modes_round_trip_through_their_stored_names() {
        for mode in [RateMode::Overall, RateMode::PerClient] {
            assert_eq!(RateMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(RateMode::parse("other"), None);
    }
}

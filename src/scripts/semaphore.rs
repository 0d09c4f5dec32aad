//! The semaphore scripts' KEYS and ARGV, and their replies, each encoded or
//! decoded in one place. The `.lua` files (and `lib/permits.lua`, for the
//! keys every one of them takes) document what each argument means and
//! what comes back.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::{millis, Call, SEM_ACQUIRE, SEM_ADJUST, SEM_RELEASE, SEM_RENEW, SEM_SET, SEM_STATE};
use crate::keys::SemaphoreKeys;

/// A call of `script` on the six keys of `keys`, in the order every
/// semaphore script but renew.lua takes them.
fn on(script: &'static std::sync::LazyLock<redis::Script>, keys: &SemaphoreKeys) -> Call {
    Call::new(script)
        .key(&keys.state)
        .key(&keys.holders)
        .key(&keys.counts)
        .key(&keys.waiters)
        .key(&keys.baton)
        .key(&keys.reserved_baton)
}

/// Sets the total to `total` unless one is in force.
pub(crate) fn set(keys: &SemaphoreKeys, total: u64, baton_ttl: Duration) -> Call {
    on(&SEM_SET, keys).arg(total).arg(millis(baton_ttl))
}

/// Which way [`adjust`] moves the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adjust {
    Add,
    Reduce,
}

/// How long adjust.lua remembers the id of an adjustment it applied: far
/// longer than any resend of it takes to arrive.
const ADJUSTMENT_REMEMBERED: Duration = Duration::from_secs(300);

/// Moves the total by `permits`; `request` identifies the call so that a
/// resend is applied once.
pub(crate) fn adjust(
    keys: &SemaphoreKeys,
    way: Adjust,
    permits: u64,
    request: &str,
    baton_ttl: Duration,
) -> Call {
    let way = match way {
        Adjust::Add => "add",
        Adjust::Reduce => "reduce",
    };
    on(&SEM_ADJUST, keys)
        .key(&keys.adjusted)
        .arg(way)
        .arg(permits)
        .arg(request)
        .arg(millis(baton_ttl))
        .arg(millis(ADJUSTMENT_REMEMBERED))
}

/// What [`acquire`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireArgs<'a> {
    /// `<thread identity>:<request number>`.
    pub(crate) id: &'a str,
    pub(crate) permits: u64,
    pub(crate) lease: Duration,
    /// The caller's place among the waiters (`<k>:<identity>`), or `None`
    /// for a caller that will not wait.
    pub(crate) place: Option<&'a str>,
    /// How long a place lasts without a new attempt.
    pub(crate) place_ttl: Duration,
    /// When the caller has waited long enough to hold newcomers back (to
    /// reserve the permits it needs when it is short): how long the
    /// reservation lasts unless it comes back.
    pub(crate) reserve_for: Option<Duration>,
    /// Pop the baton first: the caller's park ended when the list changed,
    /// without a look that would have popped its token for it.
    pub(crate) takes_token: bool,
    /// A waiter that parks where a grant reaches it: this attempt's request
    /// number (the id's last part) and the lease of a grant, which a
    /// release may give it while it is parked (see `release.lua`).
    pub(crate) grantable: Option<(u64, Duration)>,
}

pub(crate) fn acquire(keys: &SemaphoreKeys, args: AcquireArgs<'_>, baton_ttl: Duration) -> Call {
    let call = on(&SEM_ACQUIRE, keys)
        .arg(args.id)
        .arg(args.permits)
        .arg(millis(args.lease))
        .arg(args.place.unwrap_or(""))
        .arg(millis(args.place_ttl))
        .arg(millis(baton_ttl))
        .arg(args.reserve_for.map_or(0, millis))
        .arg(if args.takes_token { "1" } else { "0" });
    match args.grantable {
        Some((request, lease)) => call
            .key(&keys.grant_specs)
            .arg(format!("{request} {}", millis(lease))),
        None => call,
    }
}

/// Returns the permits of `id`; `channels`: where the deployment allows
/// grants, the prefix of the clients' grant channels (the release grants
/// the permits it frees, see `release.lua`).
pub(crate) fn release(
    keys: &SemaphoreKeys,
    id: &str,
    baton_ttl: Duration,
    channels: Option<&str>,
) -> Call {
    let call = on(&SEM_RELEASE, keys).arg(id).arg(millis(baton_ttl));
    match channels {
        Some(channels) => call.key(&keys.grant_specs).arg(channels).arg(""),
        None => call,
    }
}

/// Gives back the permits a release granted to `id` (a waiter that was not
/// parked for them) while their lease still ends at `ends`, the grant's
/// (server ms, as its message told), granting them on `channels`.
pub(crate) fn give_back(
    keys: &SemaphoreKeys,
    id: &str,
    ends: &str,
    baton_ttl: Duration,
    channels: &str,
) -> Call {
    on(&SEM_RELEASE, keys)
        .key(&keys.grant_specs)
        .arg(id)
        .arg(millis(baton_ttl))
        .arg(channels)
        .arg(ends)
}

/// Renews the lease of permit `id`, which lives in `holders_key`.
pub(crate) fn renew(holders_key: &str, id: &str, lease: Duration) -> Call {
    Call::new(&SEM_RENEW)
        .key(holders_key)
        .arg(id)
        .arg(millis(lease))
}

/// Reads the total and the available permits.
pub(crate) fn state(keys: &SemaphoreKeys, baton_ttl: Duration) -> Call {
    on(&SEM_STATE, keys).arg(millis(baton_ttl))
}

/// The replies every semaphore script may give instead of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No total was ever set (`{-1}`).
    NotSet,
    /// More permits than the total (`{-2, total}`); from adjust.lua: adding
    /// would take the total past the most a semaphore holds.
    OverCapacity { total: u64 },
    /// The state's `field` is missing or malformed (`{-3, field}`).
    Damaged { field: &'static str },
}

impl Refusal {
    fn parse(reply: &[i64]) -> Option<Refusal> {
        Some(match *reply {
            [-1] => Refusal::NotSet,
            [-2, total] => Refusal::OverCapacity {
                total: total.unsigned_abs(),
            },
            [-3, field] => Refusal::Damaged {
                field: if field == 1 { "total" } else { "used" },
            },
            _ => return None,
        })
    }
}

/// What set.lua and adjust.lua answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TotalReply {
    /// The total in force after the call; `written` when this call wrote it.
    Total {
        total: u64,
        written: bool,
    },
    Refused(Refusal),
}

impl FromRedisValue for TotalReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply = ints(value)?;
        match reply[..] {
            [1, total] => Ok(TotalReply::Total {
                total: total.unsigned_abs(),
                written: true,
            }),
            [0, total] => Ok(TotalReply::Total {
                total: total.unsigned_abs(),
                written: false,
            }),
            _ => refused(&reply, TotalReply::Refused),
        }
    }
}

/// What acquire.lua answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Acquired {
        permits: u64,
    },
    /// Not enough permits; the first holder's lease ends in `lease_left`
    /// (`None`: no holder). `reserving`: the caller's place holds
    /// newcomers back, and its baton is the reserved one. `passed_on`: the
    /// call pushed tokens for other waiters.
    Short {
        available: u64,
        lease_left: Option<Duration>,
        reserving: bool,
        passed_on: bool,
    },
    Refused(Refusal),
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply = ints(value)?;
        match reply[..] {
            [1, permits] => Ok(AcquireReply::Acquired {
                permits: permits.unsigned_abs(),
            }),
            [0, available, left, reserving, passed] => Ok(AcquireReply::Short {
                available: available.unsigned_abs(),
                lease_left: u64::try_from(left).ok().map(Duration::from_millis),
                reserving: reserving == 1,
                passed_on: passed > 0,
            }),
            _ => refused(&reply, AcquireReply::Refused),
        }
    }
}

/// What release.lua answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    Released {
        permits: u64,
    },
    /// The permit id held nothing: its lease had ended.
    NotHeld,
    Refused(Refusal),
}

impl FromRedisValue for ReleaseReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply = ints(value)?;
        match reply[..] {
            [1, permits] => Ok(ReleaseReply::Released {
                permits: permits.unsigned_abs(),
            }),
            [0] => Ok(ReleaseReply::NotHeld),
            _ => refused(&reply, ReleaseReply::Refused),
        }
    }
}

/// What state.lua answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateReply {
    State { total: u64, available: u64 },
    Refused(Refusal),
}

impl FromRedisValue for StateReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply = ints(value)?;
        match reply[..] {
            [1, total, available] => Ok(StateReply::State {
                total: total.unsigned_abs(),
                available: available.unsigned_abs(),
            }),
            _ => refused(&reply, StateReply::Refused),
        }
    }
}

fn ints(value: Value) -> Result<Vec<i64>, ParsingError> {
    FromRedisValue::from_redis_value(value)
}

fn refused<T>(reply: &[i64], wrap: fn(Refusal) -> T) -> Result<T, ParsingError> {
    Refusal::parse(reply)
        .map(wrap)
        .ok_or_else(|| format!("unexpected reply {reply:?} from a semaphore script").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    #[test]
    fn replies_decode_every_documented_shape() {
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[1, 3])).unwrap(),
            AcquireReply::Acquired { permits: 3 }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[0, 1, -1, 0, 0])).unwrap(),
            AcquireReply::Short {
                available: 1,
                lease_left: None,
                reserving: false,
                passed_on: false,
            }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[0, 0, 250, 1, 2])).unwrap(),
            AcquireReply::Short {
                available: 0,
                lease_left: Some(Duration::from_millis(250)),
                reserving: true,
                passed_on: true,
            }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[-2, 5])).unwrap(),
            AcquireReply::Refused(Refusal::OverCapacity { total: 5 })
        );
        assert_eq!(
            ReleaseReply::from_redis_value(ints(&[0])).unwrap(),
            ReleaseReply::NotHeld
        );
        assert_eq!(
            TotalReply::from_redis_value(ints(&[0, 7])).unwrap(),
            TotalReply::Total {
                total: 7,
                written: false
            }
        );
        assert_eq!(
            StateReply::from_redis_value(ints(&[-3, 2])).unwrap(),
            StateReply::Refused(Refusal::Damaged { field: "used" })
        );
        assert_eq!(
            StateReply::from_redis_value(ints(&[-1])).unwrap(),
            StateReply::Refused(Refusal::NotSet)
        );
        assert!(ReleaseReply::from_redis_value(ints(&[9, 9, 9])).is_err());
    }
}

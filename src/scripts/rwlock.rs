//! The read-write lock's scripts (`rwlock/*.lua`): their KEYS and ARGV,
//! each encoded in one place, and their replies, decoded in one place. The
//! `.lua` files document what each argument means and what comes back;
//! releases answer like the lock's (`reply::ReleaseReply`), renewals and
//! give-ups with `reply::Done`.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::{
    millis, Call, RW_CANCEL_UPGRADE, RW_READ, RW_RELEASE_READ, RW_RELEASE_UPGRADABLE,
    RW_RELEASE_WRITE, RW_RENEW_READ, RW_UNDO, RW_UPGRADABLE, RW_UPGRADE, RW_WITHDRAW, RW_WRITE,
};
use crate::keys::RwKeys;

/// How a read attempt asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadAsking {
    /// A `try_read`: refused, it will not wait, so its refusal asks
    /// nobody to wake it (no `rwait` for a read baton nobody parks for).
    Once,
    /// The first attempt of a call that waits if refused.
    First,
    /// An attempt from the wait loop: it passes a read baton on.
    Waited,
}

/// What [`read`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadArgs<'a> {
    pub(crate) identity: &'a str,
    /// The lease of a fresh hold, or of the hold re-entered.
    pub(crate) lease: Duration,
    /// The token of the caller's live read guards, 0 when it has none.
    pub(crate) held_token: u64,
    /// The depth after this acquisition.
    pub(crate) depth: usize,
    /// The request's number: a fresh hold's token.
    pub(crate) request: u64,
    /// How it asks: from waiting, it passes a baton on.
    pub(crate) asking: ReadAsking,
    pub(crate) baton_ttl: Duration,
    /// Pop the read baton first: the caller's park ended when the list
    /// changed, without a look that would have popped its token for it.
    pub(crate) takes_token: bool,
    /// From a waiter that parks where a writer's release may grant it the
    /// read: the grant's lease, and how long the spec it leaves when a
    /// writer refuses it lives.
    pub(crate) grantable: Option<(Duration, Duration)>,
}

pub(crate) fn read(keys: &RwKeys, args: ReadArgs<'_>) -> Call {
    let call = Call::new(&RW_READ)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.read_baton)
        .key(&keys.upgradable)
        .arg(args.identity)
        .arg(millis(args.lease))
        .arg(args.held_token)
        .arg(args.depth)
        .arg(args.request)
        .arg(match args.asking {
            ReadAsking::Once => "-1",
            ReadAsking::First => "0",
            ReadAsking::Waited => "1",
        })
        .arg(millis(args.baton_ttl))
        .arg(if args.takes_token { "1" } else { "0" });
    match args.grantable {
        Some((lease, spec_ttl)) => call
            .key(&keys.read_grants)
            .arg(millis(lease))
            .arg(millis(spec_ttl)),
        None => call,
    }
}

/// What [`write`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteArgs<'a> {
    pub(crate) identity: &'a str,
    /// The lease of a fresh hold, or of the hold re-entered.
    pub(crate) lease: Duration,
    /// The fencing token of the caller's live write guards, 0 when none.
    pub(crate) held_fence: u64,
    /// The depth after this acquisition.
    pub(crate) depth: usize,
    pub(crate) fence_ttl: Duration,
    /// The request's number, for undoing it if its reply is lost.
    pub(crate) request: u64,
    /// When refused, keep a place among the waiting writers this long
    /// (`None`: the caller will not wait).
    pub(crate) place: Option<Duration>,
    /// The token of the caller's live read guards, 0 when it has none.
    pub(crate) read_token: u64,
    /// Pop the write baton first: the caller's park ended when the list
    /// changed, without a look that would have popped its token for it.
    pub(crate) takes_token: bool,
    /// From a waiter that parks where a release may grant it the write
    /// hold: the grant's lease, and how long the spec it leaves with its
    /// place lives.
    pub(crate) grantable: Option<(Duration, Duration)>,
}

pub(crate) fn write(keys: &RwKeys, args: WriteArgs<'_>) -> Call {
    let call = Call::new(&RW_WRITE)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.fence)
        .key(&keys.upgradable)
        .arg(args.identity)
        .arg(millis(args.lease))
        .arg(args.held_fence)
        .arg(args.depth)
        .arg(millis(args.fence_ttl))
        .arg(args.request)
        .arg(args.place.map_or(0, millis))
        .arg(args.read_token);
    let takes_token = if args.takes_token { "1" } else { "0" };
    match args.grantable {
        Some((lease, spec_ttl)) => call
            .key(&keys.write_baton)
            .arg(takes_token)
            .key(&keys.write_grants)
            .arg(millis(lease))
            .arg(millis(spec_ttl)),
        // Only then: the usual attempt names six keys and eight arguments.
        None if args.takes_token => call.key(&keys.write_baton).arg(takes_token),
        None => call,
    }
}

/// The `behind` of a write grant's message (a read grant's is the end of
/// the hold's lease it wrote): see `lib/write_grant.lua`.
pub(crate) const WRITE_GRANT_BEHIND: &str = "w";

/// Where a release may grant the write hold to a waiting writer: the
/// prefix of the clients' grant channels, and the fence's TTL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteGrants<'a> {
    pub(crate) channels: &'a str,
    pub(crate) fence_ttl: Duration,
}

/// Releases one level of the read hold `token` of `identity`, which keeps
/// `guards_left` guards; `lease` is the hold's. The last reader's release
/// grants the write hold to a waiting writer, where `grants` is given.
pub(crate) fn release_read(
    keys: &RwKeys,
    identity: &str,
    token: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
    grants: Option<WriteGrants<'_>>,
) -> Call {
    release_read_call(
        keys,
        identity,
        token,
        guards_left,
        lease,
        baton_ttl,
        "",
        grants,
    )
}

/// [`release_read`], made only while the hold's lease ends at `ends`
/// (server ms) when that is not empty (a give-back).
#[allow(clippy::too_many_arguments)]
fn release_read_call(
    keys: &RwKeys,
    identity: &str,
    token: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
    ends: &str,
    grants: Option<WriteGrants<'_>>,
) -> Call {
    let call = Call::new(&RW_RELEASE_READ)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.write_baton)
        .key(&keys.upgradable)
        .key(&keys.upgrade_baton)
        .arg(identity)
        .arg(token)
        .arg(guards_left)
        .arg(millis(lease))
        .arg(millis(baton_ttl));
    match grants {
        Some(grants) => call
            .arg(ends)
            .key(&keys.write_grants)
            .key(&keys.fence)
            .arg(grants.channels)
            .arg(millis(grants.fence_ttl)),
        None if ends.is_empty() => call,
        None => call.arg(ends),
    }
}

/// Gives back the read a writer's release granted `identity` under
/// `token` (its request), which no parked waiter took: the last release of
/// the hold, made only while its lease ends at `ends` (server ms), the end
/// the grant wrote.
pub(crate) fn give_back_read(
    keys: &RwKeys,
    identity: &str,
    token: u64,
    ends: &str,
    lease: Duration,
    baton_ttl: Duration,
    grants: Option<WriteGrants<'_>>,
) -> Call {
    release_read_call(keys, identity, token, 0, lease, baton_ttl, ends, grants)
}

/// Releases one level of the write hold `fence` of `identity`; the last
/// grants the read to the waiting readers that left a spec, or the write
/// hold to a waiting writer that left one, where `grants` is given.
pub(crate) fn release_write(
    keys: &RwKeys,
    identity: &str,
    fence: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
    grants: Option<WriteGrants<'_>>,
) -> Call {
    let call = Call::new(&RW_RELEASE_WRITE)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.read_baton)
        .key(&keys.write_baton)
        .key(&keys.upgradable)
        .key(&keys.upgradable_baton)
        .arg(identity)
        .arg(fence)
        .arg(guards_left)
        .arg(millis(lease))
        .arg(millis(baton_ttl));
    match grants {
        Some(grants) => call
            .key(&keys.read_grants)
            .arg(grants.channels)
            .key(&keys.write_grants)
            .key(&keys.fence)
            .arg(millis(grants.fence_ttl)),
        None => call,
    }
}

/// Removes the waiting writer `identity`'s place (and its grant spec).
pub(crate) fn withdraw(keys: &RwKeys, identity: &str, baton_ttl: Duration) -> Call {
    Call::new(&RW_WITHDRAW)
        .key(&keys.waiting_writers)
        .key(&keys.read_baton)
        .key(&keys.upgradable_baton)
        .key(&keys.write_grants)
        .arg(identity)
        .arg(millis(baton_ttl))
}

/// Renews the read hold `token` of `identity` in `readers` (with its
/// `depths` beside it).
pub(crate) fn renew_read(
    readers: &str,
    depths: &str,
    identity: &str,
    token: u64,
    lease: Duration,
) -> Call {
    Call::new(&RW_RENEW_READ)
        .key(readers)
        .key(depths)
        .arg(identity)
        .arg(token)
        .arg(millis(lease))
}

/// Frees what request `request` of `identity` may have taken.
pub(crate) fn undo(keys: &RwKeys, identity: &str, request: u64, baton_ttl: Duration) -> Call {
    Call::new(&RW_UNDO)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.read_baton)
        .key(&keys.write_baton)
        .key(&keys.upgradable)
        .key(&keys.upgradable_baton)
        .key(&keys.upgrade_baton)
        .arg(identity)
        .arg(request)
        .arg(millis(baton_ttl))
}

/// What [`upgradable`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpgradableArgs<'a> {
    pub(crate) identity: &'a str,
    /// The lease of a fresh hold, or of the hold re-entered.
    pub(crate) lease: Duration,
    /// The token of the caller's live upgradable guards, 0 when none.
    pub(crate) held_token: u64,
    /// The depth after this acquisition.
    pub(crate) depth: usize,
    /// The request's number: a fresh hold's token.
    pub(crate) request: u64,
    /// Whether the caller comes from waiting (others may wait too).
    pub(crate) waited: bool,
}

pub(crate) fn upgradable(keys: &RwKeys, args: UpgradableArgs<'_>) -> Call {
    Call::new(&RW_UPGRADABLE)
        .key(&keys.upgradable)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .arg(args.identity)
        .arg(millis(args.lease))
        .arg(args.held_token)
        .arg(args.depth)
        .arg(args.request)
        .arg(if args.waited { "1" } else { "0" })
}

/// Releases one level of the upgradable hold `token` of `identity`, which
/// keeps `guards_left` guards; `lease` is the hold's. The last grants the
/// write hold to a waiting writer, where `grants` is given.
pub(crate) fn release_upgradable(
    keys: &RwKeys,
    identity: &str,
    token: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
    grants: Option<WriteGrants<'_>>,
) -> Call {
    let call = Call::new(&RW_RELEASE_UPGRADABLE)
        .key(&keys.upgradable)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.read_baton)
        .key(&keys.write_baton)
        .key(&keys.upgradable_baton)
        .arg(identity)
        .arg(token)
        .arg(guards_left)
        .arg(millis(lease))
        .arg(millis(baton_ttl));
    match grants {
        Some(grants) => call
            .key(&keys.write_grants)
            .key(&keys.fence)
            .arg(grants.channels)
            .arg(millis(grants.fence_ttl)),
        None => call,
    }
}

/// What [`upgrade`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpgradeArgs<'a> {
    pub(crate) identity: &'a str,
    /// The token of the caller's upgradable hold.
    pub(crate) upgradable_token: u64,
    /// The lease of the write hold.
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Duration,
    /// The request's number, for undoing it if its reply is lost.
    pub(crate) request: u64,
    /// When refused, mark the upgrade as waiting this long (`None`: the
    /// caller will not wait).
    pub(crate) mark: Option<Duration>,
    /// The token of the caller's live read guards, 0 when it has none.
    pub(crate) read_token: u64,
}

pub(crate) fn upgrade(keys: &RwKeys, args: UpgradeArgs<'_>) -> Call {
    Call::new(&RW_UPGRADE)
        .key(&keys.upgradable)
        .key(&keys.write)
        .key(&keys.readers)
        .key(&keys.read_depths)
        .key(&keys.waiting_writers)
        .key(&keys.fence)
        .arg(args.identity)
        .arg(args.upgradable_token)
        .arg(millis(args.lease))
        .arg(millis(args.fence_ttl))
        .arg(args.request)
        .arg(args.mark.map_or(0, millis))
        .arg(args.read_token)
}

/// Takes the waiting-upgrade mark of the upgradable hold `token` of
/// `identity` off.
pub(crate) fn cancel_upgrade(
    keys: &RwKeys,
    identity: &str,
    token: u64,
    baton_ttl: Duration,
) -> Call {
    Call::new(&RW_CANCEL_UPGRADE)
        .key(&keys.upgradable)
        .key(&keys.read_baton)
        .arg(identity)
        .arg(token)
        .arg(millis(baton_ttl))
}

/// What `rwlock/read.lua`, `write.lua`, `upgradable.lua` or `upgrade.lua`
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwAcquireReply {
    /// Taken afresh (depth 1) or re-entered, under `token` (a write hold's
    /// fencing token, a read hold's token).
    Acquired { token: u64, depth: u64 },
    /// Refused; worth looking again after `lease_left` (`None`: only a
    /// release will change anything). `spec_left`: a read refused by a
    /// holding writer left a grant spec (see `read.lua`), or a write
    /// refused kept its place with one (`write.lua`).
    Held {
        lease_left: Option<Duration>,
        spec_left: bool,
    },
    /// The caller reads and asked to write.
    UpgradeRefused,
    /// The caller asked to upgrade an upgradable hold that is not there
    /// any more (its lease ran out).
    NotHeld,
}

impl FromRedisValue for RwAcquireReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply: Vec<i64> = FromRedisValue::from_redis_value(value)?;
        match reply[..] {
            [1, token, depth] => Ok(RwAcquireReply::Acquired {
                token: token.unsigned_abs(),
                depth: depth.unsigned_abs(),
            }),
            [0, wait] => Ok(RwAcquireReply::Held {
                lease_left: u64::try_from(wait).ok().map(Duration::from_millis),
                spec_left: false,
            }),
            [0, wait, 1] => Ok(RwAcquireReply::Held {
                lease_left: u64::try_from(wait).ok().map(Duration::from_millis),
                spec_left: true,
            }),
            [-2] => Ok(RwAcquireReply::UpgradeRefused),
            [-3] => Ok(RwAcquireReply::NotHeld),
            _ => {
                Err(format!("unexpected reply {reply:?} from an rwlock acquisition script").into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    #[test]
    fn acquire_replies_decode_every_documented_shape() {
        assert_eq!(
            RwAcquireReply::from_redis_value(ints(&[1, 42, 2])).unwrap(),
            RwAcquireReply::Acquired {
                token: 42,
                depth: 2
            }
        );
        assert_eq!(
            RwAcquireReply::from_redis_value(ints(&[0, 250])).unwrap(),
            RwAcquireReply::Held {
                lease_left: Some(Duration::from_millis(250)),
                spec_left: false,
            }
        );
        assert_eq!(
            RwAcquireReply::from_redis_value(ints(&[0, -1])).unwrap(),
            RwAcquireReply::Held {
                lease_left: None,
                spec_left: false,
            }
        );
        assert_eq!(
            RwAcquireReply::from_redis_value(ints(&[-2])).unwrap(),
            RwAcquireReply::UpgradeRefused
        );
        assert_eq!(
            RwAcquireReply::from_redis_value(ints(&[-3])).unwrap(),
            RwAcquireReply::NotHeld
        );
        assert!(RwAcquireReply::from_redis_value(ints(&[3])).is_err());
    }
}

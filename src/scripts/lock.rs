//! The lock scripts' KEYS and ARGV, each encoded in one place. The `.lua`
//! files document what each argument means and what comes back.

use std::time::Duration;

use super::{
    millis, Call, ACQUIRE, FAIR_ACQUIRE, FAIR_FORCE_UNLOCK, FAIR_LEAVE, FAIR_RELEASE,
    FAIR_RELEASE_REQUEST, FORCE_UNLOCK, HANDOFF, HOLDER, RELEASE, RELEASE_REQUEST, RENEW,
};
use crate::keys::LockKeys;

/// What [`acquire`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireArgs<'a> {
    pub(crate) identity: &'a str,
    /// The lease of a fresh acquisition, or of the ownership re-entered.
    pub(crate) lease: Duration,
    /// The fencing token of the caller's live guards, 0 when it has none.
    pub(crate) held_fence: u64,
    /// The depth after this acquisition.
    pub(crate) depth: usize,
    pub(crate) fence_ttl: Duration,
    /// The request's number, for undoing it if its reply is lost.
    pub(crate) request: u64,
    /// Whether the caller has been waiting (others may wait behind it).
    pub(crate) waited: bool,
    /// A fair lock's: how long a waiter's place in the queue lives unless
    /// the waiter comes back.
    pub(crate) place_ttl: Duration,
    /// A quorum's proposed fencing token (0: none): the token is at least
    /// this.
    pub(crate) proposed_token: u64,
}

/// The acquisition script of `keys`'s lock (a fair lock's takes or keeps
/// a place in its queue when the caller waits).
pub(crate) fn acquire(keys: &LockKeys, args: AcquireArgs<'_>) -> Call {
    let call = Call::new(if keys.fair { &FAIR_ACQUIRE } else { &ACQUIRE })
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(args.identity)
        .arg(millis(args.lease))
        .arg(args.held_fence)
        .arg(args.depth)
        .arg(millis(args.fence_ttl))
        .arg(args.request)
        .arg(if args.waited { "1" } else { "0" });
    if keys.fair {
        call.arg(millis(args.place_ttl))
    } else {
        call.arg(args.proposed_token)
    }
}

/// What [`handoff`] asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandoffArgs<'a> {
    pub(crate) from: &'a str,
    pub(crate) fence: u64,
    pub(crate) to: &'a str,
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Duration,
    pub(crate) request: u64,
    /// A quorum's proposed fencing token (0: none).
    pub(crate) proposed_token: u64,
}

pub(crate) fn handoff(keys: &LockKeys, args: HandoffArgs<'_>) -> Call {
    Call::new(&HANDOFF)
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(args.from)
        .arg(args.fence)
        .arg(args.to)
        .arg(millis(args.lease))
        .arg(millis(args.fence_ttl))
        .arg(args.request)
        .arg(args.proposed_token)
}

/// Releases one level of the ownership `fence` of `identity`, which keeps
/// `guards_left` guards; `lease` is the ownership's.
pub(crate) fn release(
    keys: &LockKeys,
    identity: &str,
    fence: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
) -> Call {
    Call::new(if keys.fair { &FAIR_RELEASE } else { &RELEASE })
        .key(&keys.lock)
        .key(&keys.baton)
        .arg(identity)
        .arg(fence)
        .arg(guards_left)
        .arg(millis(lease))
        .arg(millis(baton_ttl))
}

/// Frees the ownership that request `request` made for `identity`, if it
/// is still there.
pub(crate) fn release_request(
    keys: &LockKeys,
    identity: &str,
    request: u64,
    baton_ttl: Duration,
) -> Call {
    Call::new(if keys.fair {
        &FAIR_RELEASE_REQUEST
    } else {
        &RELEASE_REQUEST
    })
    .key(&keys.lock)
    .key(&keys.baton)
    .arg(identity)
    .arg(request)
    .arg(millis(baton_ttl))
}

pub(crate) fn force_unlock(keys: &LockKeys, baton_ttl: Duration) -> Call {
    Call::new(if keys.fair {
        &FAIR_FORCE_UNLOCK
    } else {
        &FORCE_UNLOCK
    })
    .key(&keys.lock)
    .key(&keys.baton)
    .arg(millis(baton_ttl))
}

/// A fair lock's waiter `identity` that gave up leaves the queue.
pub(crate) fn leave_queue(keys: &LockKeys, identity: &str, baton_ttl: Duration) -> Call {
    Call::new(&FAIR_LEAVE)
        .key(&keys.lock)
        .key(&keys.baton)
        .arg(identity)
        .arg(millis(baton_ttl))
}

pub(crate) fn renew(lock_key: &str, identity: &str, fence: u64, lease: Duration) -> Call {
    Call::new(&RENEW)
        .key(lock_key)
        .arg(identity)
        .arg(fence)
        .arg(millis(lease))
}

pub(crate) fn holder(keys: &LockKeys) -> Call {
    Call::new(&HOLDER).key(&keys.lock)
}

/// Proposes the quorum token `token` to one master for `identity`'s
/// ownership.
#[cfg(feature = "redlock")]
pub(crate) fn adopt_fence(
    keys: &LockKeys,
    identity: &str,
    token: u64,
    fence_ttl: Duration,
) -> Call {
    Call::new(&super::ADOPT_FENCE)
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(identity)
        .arg(token)
        .arg(millis(fence_ttl))
}

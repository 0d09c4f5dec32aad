//! The lock scripts' KEYS and ARGV, each encoded in one place. The `.lua`
//! files document what each argument means and what comes back.

use std::time::Duration;

use super::{
    millis, Call, ACQUIRE, ACQUIRE_MANY, FAIR_ACQUIRE, FAIR_FORCE_UNLOCK, FAIR_HANDOFF, FAIR_LEAVE,
    FAIR_RELEASE, FAIR_RELEASE_REQUEST, FAIR_WAKE, FORCE_UNLOCK, HANDOFF, HOLDER, RELEASE,
    RELEASE_REQUEST, RENEW, WITHDRAW,
};
use crate::keys::{FairKeys, LockKeys};

/// How long a lock freed while someone waited for it stays shut to
/// newcomers, for the waiter its baton woke to come and take it
/// (`lib/hand_over.lua`): a few of that waiter's round trips, with room for
/// a loaded machine. A woken waiter that never comes (its process died)
/// costs newcomers at most this.
pub(crate) const HAND_OVER_WINDOW: Duration = Duration::from_millis(100);

/// How the caller of an acquisition asks, as the scripts tell it
/// (`lock/acquire.lua`'s ARGV[7]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asking {
    /// The first attempt of a call that waits if it must: a newcomer, kept
    /// out of a lock in its hand-over window.
    First,
    /// An attempt of a call that has been asking this long (others may
    /// wait behind it). It takes a lock in its hand-over window only if the
    /// window is kept for it, or after the window's first moments if it
    /// was asking before the window opened (`lib/hand_over.lua`).
    Waited(Duration),
    /// The one attempt of a call that never waits (`try_lock`): it takes a
    /// lock in its hand-over window, which nobody may be left to take.
    Once,
}

impl Asking {
    /// Whether the caller waits if it must: a fair lock's attempt then
    /// takes (or keeps) a place in the queue, from the first attempt on.
    fn waits(self) -> bool {
        !matches!(self, Asking::Once)
    }

    /// The plain lock scripts' encoding: -1 once, 0 first, else the
    /// microseconds the caller has been asking (at least 1).
    fn arg(self) -> i64 {
        match self {
            Asking::First => 0,
            Asking::Waited(asked) => i64::try_from(asked.as_micros()).unwrap_or(i64::MAX).max(1),
            Asking::Once => -1,
        }
    }
}

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
    /// Whether the caller has been waiting, or never will.
    pub(crate) asking: Asking,
    /// A fair lock's: how long a waiter's place in the queue lives unless
    /// the waiter comes back.
    pub(crate) place_ttl: Duration,
    /// A fair lock's: the caller's arrival in the queue (server µs) as an
    /// earlier attempt of this wait returned it, 0 before it has one.
    pub(crate) arrival: u64,
    /// A quorum's proposed fencing token (0: none): the token is at least
    /// this.
    pub(crate) proposed_token: u64,
    /// Tokens set aside above a fresh ownership's, for the in-memory
    /// hand-offs of the caller's process (0: none).
    pub(crate) reserve: u32,
    /// Take the lock only if it is free: another thread of this client
    /// holds what the caller took under its identity (passed in memory).
    pub(crate) free_only: bool,
    /// Pop the token first: the caller's park ended when its list (the
    /// baton; a fair lock's waiter's own list or the head's list) changed,
    /// without a look that would have popped its token for it.
    pub(crate) takes_token: bool,
    /// A plain lock's waiter parked since its last attempt: its park may
    /// have ended with the token a look popped for it, which the window
    /// this attempt is kept out of may need to wake its own waiter. So it
    /// names its baton, to put a token back then (`lib/hand_over.lua`'s
    /// `tell_kept_waiter`). Not on a quorum, whose callers are not kept out
    /// of a window's first part.
    pub(crate) after_park: bool,
    /// The TTL of such a token.
    pub(crate) baton_ttl: Duration,
    /// A waiter that parks where a grant reaches it: the release of an
    /// ownership it finds in its way (a fair lock's: the release that
    /// makes it the next holder) may grant it the lock (`lib/grant.lua`),
    /// by a message naming this request, for this lease (`None`: no
    /// grant).
    pub(crate) grantable: Option<Duration>,
    /// A fair lock's: the caller's last park was on the head's list
    /// ([`FairKeys::next`]), not its own.
    pub(crate) on_heads_list: bool,
}

/// The acquisition script of `keys`'s lock (a fair lock's takes or keeps
/// a place in its queue when the caller waits).
pub(crate) fn acquire(keys: &LockKeys, args: AcquireArgs<'_>) -> Call {
    let script = if keys.fair.is_some() {
        &FAIR_ACQUIRE
    } else {
        &ACQUIRE
    };
    let call = Call::new(script).key(&keys.lock).key(&keys.fence);
    let call = match &keys.fair {
        Some(fair) => call.key(&fair.queue).key(&fair.places),
        None => call,
    }
    .arg(args.identity)
    .arg(millis(args.lease))
    .arg(args.held_fence)
    .arg(args.depth)
    .arg(millis(args.fence_ttl))
    .arg(args.request);
    if let Some(fair) = &keys.fair {
        // The fair lock's waiters queue in Redis: no hand-over window.
        let call = call.arg(if args.asking.waits() { "1" } else { "0" });
        let call = call.arg(millis(args.place_ttl)).arg(args.arrival);
        // ARGV[12] to ARGV[14] follow ARGV[10] and ARGV[11]; the grant
        // spec's key is the last.
        let line_and_free = |call: Call| {
            let call = call
                .arg(args.reserve)
                .arg(if args.free_only { "1" } else { "0" });
            match args.grantable {
                Some(lease) => call.arg(millis(lease)).key(&keys.grant_spec(args.identity)),
                None => call.arg(0),
            }
        };
        if !args.takes_token && !args.on_heads_list {
            return line_and_free(call.arg("0").arg("0"));
        }
        // The list the caller parked on: popped, or (the head's list)
        // pushed again for the head; left out while the slot migrates
        // (see `fair/acquire.lua`).
        let parked_on = if args.on_heads_list {
            fair.next.clone()
        } else {
            keys.wake_list(args.identity)
        };
        let without = line_and_free(call.clone().arg("0").arg("0"));
        let with = call
            .key(&parked_on)
            .arg(if args.takes_token { "1" } else { "0" })
            .arg(if args.on_heads_list { "1" } else { "0" });
        line_and_free(with).or_when_split(without)
    } else {
        let call = call
            .arg(args.asking.arg())
            .arg(args.proposed_token)
            .arg(args.reserve)
            .arg(if args.free_only { "1" } else { "0" });
        // Only a waiter just out of a park names its baton (to pop its
        // token, or to tell the waiter a window is kept for:
        // `lib/hand_over.lua`): the usual attempt names two keys and ten
        // arguments. The baton is left out while the slot migrates (an
        // empty list is on neither node), as the fair lock leaves out its
        // lists.
        if !args.takes_token && !args.after_park && args.grantable.is_none() {
            return call;
        }
        let parked = match (args.takes_token, args.after_park) {
            (true, _) => "1",
            (false, true) => "0",
            (false, false) => "2",
        };
        let with = call
            .clone()
            .key(&keys.baton)
            .arg(parked)
            .arg(millis(args.baton_ttl))
            .arg(args.grantable.map_or(0, millis));
        with.or_when_split(call)
    }
}

/// What [`acquire_many`] asks for on each name, in the order of its keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ManyName<'a> {
    pub(crate) keys: &'a LockKeys,
    /// The lease of a fresh acquisition, or of the ownership re-entered.
    pub(crate) lease: Duration,
    /// The fencing token of the caller's live guards, 0 when it has none.
    pub(crate) held_fence: u64,
    /// The depth after this acquisition.
    pub(crate) depth: usize,
    /// The owner the caller's live guards hold the name as (empty with
    /// none): the identity of the thread of this process that took it in
    /// Redis.
    pub(crate) stamp: &'a str,
    /// Take the name only if it is free (see [`AcquireArgs::free_only`]).
    pub(crate) free_only: bool,
}

/// What [`acquire_many`] asks for as a whole.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ManyArgs<'a> {
    pub(crate) identity: &'a str,
    pub(crate) fence_ttl: Duration,
    /// The request's number, for undoing each name if the reply is lost.
    pub(crate) request: u64,
    /// Whether the caller has been waiting, or never will.
    pub(crate) asking: Asking,
    /// A quorum's proposed fencing token (0: none): every name taken
    /// afresh gets a token at least this.
    pub(crate) proposed_token: u64,
    /// Tokens set aside above each fresh ownership's (0: none).
    pub(crate) reserve: u32,
}

/// The all-or-none acquisition of `names`, plain locks whose keys share
/// one cluster slot (or, on a Redlock quorum, one master).
pub(crate) fn acquire_many(names: &[ManyName<'_>], args: ManyArgs<'_>) -> Call {
    let mut call = Call::new(&ACQUIRE_MANY);
    for name in names {
        call = call.key(&name.keys.lock).key(&name.keys.fence);
    }
    call = call
        .arg(args.identity)
        .arg(millis(args.fence_ttl))
        .arg(args.request)
        .arg(args.asking.arg())
        .arg(args.proposed_token)
        .arg(args.reserve);
    for name in names {
        call = call
            .arg(millis(name.lease))
            .arg(name.held_fence)
            .arg(name.depth)
            .arg(name.stamp)
            .arg(if name.free_only { "1" } else { "0" });
    }
    call
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
    /// Tokens set aside above the new ownership's (0: none).
    pub(crate) reserve: u32,
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
        .arg(args.reserve)
}

/// The fair lock's [`handoff`], to a waiter that must be the head of the
/// queue (a quorum's token and a reserve do not apply: a fair lock lives on
/// one deployment, and passes nothing in memory).
pub(crate) fn fair_handoff(keys: &LockKeys, fair: &FairKeys, args: HandoffArgs<'_>) -> Call {
    Call::new(&FAIR_HANDOFF)
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&fair.queue)
        .key(&fair.places)
        .arg(args.from)
        .arg(args.fence)
        .arg(args.to)
        .arg(millis(args.lease))
        .arg(millis(args.fence_ttl))
        .arg(args.request)
}

/// Releases one level of the ownership `fence` of `identity`, which keeps
/// `guards_left` guards; `lease` is the ownership's. The plain lock's
/// (the fair lock's is [`fair_release`]).
/// `grants`: where the deployment allows grants, the fence counter's TTL
/// and the prefix of the clients' grant channels (the release grants the
/// lock to the waiter a window would be kept for, `lib/grant.lua`).
pub(crate) fn release(
    keys: &LockKeys,
    identity: &str,
    fence: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
    grants: Option<(Duration, &str)>,
) -> Call {
    let call = Call::new(&RELEASE).key(&keys.lock).key(&keys.baton);
    let call = match grants {
        Some(_) if guards_left == 0 => call.key(&keys.fence),
        _ => call,
    };
    let call = call
        .arg(identity)
        .arg(fence)
        .arg(guards_left)
        .arg(millis(lease))
        .arg(millis(baton_ttl))
        .arg(millis(HAND_OVER_WINDOW));
    match grants {
        Some((fence_ttl, channels)) if guards_left == 0 => {
            call.arg(millis(fence_ttl)).arg(channels)
        }
        _ => call,
    }
}

/// Each release of `batch` (plain locks of one cluster slot, or on one
/// Redlock master), given as [`release`]'s arguments (keys, identity,
/// fence, guards left, lease), in one call.
pub(crate) fn release_many(
    batch: &[(&LockKeys, &str, u64, usize, Duration)],
    baton_ttl: Duration,
) -> Call {
    let mut call = Call::new(&super::RELEASE_MANY);
    for (keys, ..) in batch {
        call = call.key(&keys.lock).key(&keys.baton);
    }
    call = call.arg(millis(baton_ttl)).arg(millis(HAND_OVER_WINDOW));
    for &(_, identity, fence, guards_left, lease) in batch {
        call = call
            .arg(identity)
            .arg(fence)
            .arg(guards_left)
            .arg(millis(lease));
    }
    call
}

/// Takes the grant of `identity`, a plain lock's waiter that stops
/// waiting, off the ownership of `keys`'s lock that marked it.
pub(crate) fn withdraw(keys: &LockKeys, identity: &str) -> Call {
    Call::new(&WITHDRAW).key(&keys.lock).arg(identity)
}

/// Frees the ownership that request `request` made for `identity`, if it
/// is still there. The plain lock's. `only_if_seen`: wake a waiter only if
/// another caller found that ownership in its way (a quorum's undo of a
/// lost round).
pub(crate) fn release_request(
    keys: &LockKeys,
    identity: &str,
    request: u64,
    baton_ttl: Duration,
    only_if_seen: bool,
) -> Call {
    Call::new(&RELEASE_REQUEST)
        .key(&keys.lock)
        .key(&keys.baton)
        .arg(identity)
        .arg(request)
        .arg(millis(baton_ttl))
        .arg(u8::from(only_if_seen))
}

pub(crate) fn force_unlock(keys: &LockKeys, baton_ttl: Duration) -> Call {
    Call::new(&FORCE_UNLOCK)
        .key(&keys.lock)
        .key(&keys.baton)
        .arg(millis(baton_ttl))
}

/// The fair lock's [`release`]: its reply also names the waiter to wake
/// ([`push_baton`]), unless the release woke it itself: the head parked on
/// the head's list, or `next_in_line`, the waiter the ownership's
/// acquisition found first in the queue, when it is still the head. A
/// last release drops the places of the waiters `served` (waiter,
/// arrival): those the ownership was passed to in memory.
// One argument per ARGV of the script, as `release` has, and the keys.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fair_release(
    keys: &LockKeys,
    fair: &FairKeys,
    identity: &str,
    fence: u64,
    guards_left: usize,
    lease: Duration,
    baton_ttl: Duration,
    next_in_line: Option<&str>,
    served: &[(String, u64)],
    grants: Option<(Duration, &str)>,
) -> Call {
    let base = Call::new(&FAIR_RELEASE)
        .key(&keys.lock)
        .key(&fair.queue)
        .key(&fair.places)
        .arg(identity)
        .arg(fence)
        .arg(guards_left)
        .arg(millis(lease))
        .arg(millis(baton_ttl));
    let with_served = |mut call: Call| {
        for (waiter, arrival) in served {
            call = call.arg(waiter.as_str()).arg(*arrival);
        }
        call
    };
    // The lists, mostly empty, are left out while the slot migrates (see
    // `fair/release.lua`), and so is a grant (never on a Cluster).
    let without = with_served(base.clone().arg("").arg("").arg(""));
    let with = base.key(&fair.next).key(&keys.fence);
    let grants = grants.filter(|_| guards_left == 0);
    let with = match next_in_line {
        Some(waiter) => {
            let with = with.key(&keys.wake_list(waiter)).arg(waiter);
            match grants {
                Some(_) => with.key(&keys.grant_spec(waiter)),
                None => with,
            }
        }
        None => with.arg(""),
    };
    let with = match grants {
        Some((fence_ttl, channels)) => with.arg(millis(fence_ttl)).arg(channels),
        None => with.arg("").arg(""),
    };
    with_served(with).or_when_split(without)
}

/// The fair lock's [`release_request`], naming the waiter to wake.
pub(crate) fn fair_release_request(
    keys: &LockKeys,
    fair: &FairKeys,
    identity: &str,
    request: u64,
) -> Call {
    Call::new(&FAIR_RELEASE_REQUEST)
        .key(&keys.lock)
        .key(&fair.queue)
        .key(&fair.places)
        .arg(identity)
        .arg(request)
}

/// The fair lock's [`force_unlock`], naming the waiter to wake.
pub(crate) fn fair_force_unlock(keys: &LockKeys, fair: &FairKeys) -> Call {
    Call::new(&FAIR_FORCE_UNLOCK)
        .key(&keys.lock)
        .key(&fair.queue)
        .key(&fair.places)
}

/// A fair lock's waiter `identity` that gave up leaves the queue; the
/// reply names the waiter to wake.
pub(crate) fn leave_queue(keys: &LockKeys, fair: &FairKeys, identity: &str) -> Call {
    Call::new(&FAIR_LEAVE)
        .key(&keys.lock)
        .key(&fair.queue)
        .key(&fair.places)
        .arg(identity)
}

/// One token on the list `baton` (for at most `baton_ttl`): the fair
/// lock's wake script pushes on whatever list it is given.
pub(crate) fn push_baton(baton: &str, baton_ttl: Duration) -> Call {
    Call::new(&FAIR_WAKE).key(baton).arg(millis(baton_ttl))
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

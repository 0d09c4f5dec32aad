//! What the synchronizers that grant (the lock, plain or fair, the
//! semaphore, and the read-write lock's reads) share about a grant: the short lease it starts with, what a
//! waiter that may be granted keeps across its attempts, and the give-back
//! of grants no parked waiter took, dispatched by the key granted.
//!
//! The channel, the message and the parked waiters it reaches are the
//! backend's (`backend::grants`); what is granted, and how, is each
//! synchronizer's script's (`lib/grant.lua`, the semaphore's
//! `release.lua`).

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::backend::{GrantReceipt, Unclaimed};
use crate::context::Context;
use crate::keys;
use crate::lease::{earlier, LeaseMode};
use crate::parking::GrantSlot;

use super::{lock, rwlock, semaphore};

/// The longest lease a release grants a waiter: what a waiter that
/// stopped waiting just as the grant came, in a process that ended before
/// it could give the grant back, costs the others. The watchdog lengthens
/// a granted hold to its own lease at once, within this even on a loaded
/// machine (and a round left unanswered is given up on in time to try
/// again, see `lease::watchdog`).
const GRANT_LEASE: Duration = Duration::from_secs(2);

/// The share of a grant's lease past which a grant is not taken as it
/// came (see [`Grantable::take`]): a quarter, so that a granted hold
/// starts with at least three quarters of it.
const GRANT_LEASE_SHARE: u32 = 4;

/// The lease of a hold a release may grant a waiter whose own hold would
/// be `mode`: none where its lease is fixed and longer, as no renewal
/// would lengthen it.
pub(crate) fn grant_lease(mode: LeaseMode) -> Option<Duration> {
    match mode {
        LeaseMode::Renewed(lease) => Some(lease.min(GRANT_LEASE)),
        LeaseMode::Fixed(lease) => (lease <= GRANT_LEASE).then_some(lease),
    }
}

/// What a waiter that may be granted what it waits for keeps across its
/// attempts: the slot the wait core fills, and the attempt its park
/// follows.
#[derive(Debug, Default)]
pub(crate) struct Grantable {
    pub(crate) slot: GrantSlot,
    marked: Cell<Option<Mark>>,
}

/// The attempt a waiter's park follows, which left the spec a release
/// grants by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    /// When it was sent.
    pub(crate) sent: Instant,
    /// The grant's lease it asked for.
    pub(crate) lease: Duration,
    /// Its request number.
    pub(crate) request: u64,
}

/// A grant a waiter takes: what came with it, and the attempt it followed.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) receipt: GrantReceipt,
    pub(crate) mark: Mark,
}

impl Grantable {
    /// Records the attempt the waiter's next park follows: its grant comes
    /// after it was sent, and names its request (`ticket`, see
    /// `backend::ticket`).
    pub(crate) fn mark(&self, ticket: String, mark: Mark) {
        self.slot.set_ticket(Some(ticket));
        self.marked.set(Some(mark));
    }

    /// Whether an attempt left a spec for this waiter (which it takes off
    /// if it stops waiting unserved).
    pub(crate) fn is_marked(&self) -> bool {
        self.marked.get().is_some()
    }

    /// The grant that ended the waiter's last park, if one did: `Ok` when
    /// it is fresh, `Err` (to be given back) when it came long after the
    /// attempt its park followed: the hold's lease is counted from that
    /// attempt's sending (no later moment is known to precede the grant),
    /// and what would be left of it could be little.
    pub(crate) fn take(&self) -> Option<Result<Taken, Taken>> {
        let receipt = self.slot.take_granted()?;
        let mark = self.marked.get()?;
        let taken = Taken { receipt, mark };
        if mark.sent.elapsed() > mark.lease / GRANT_LEASE_SHARE {
            return Some(Err(taken));
        }
        Some(Ok(taken))
    }
}

impl Taken {
    /// When a hold of `mode` granted by this grant is to be counted as
    /// sent: the attempt's sending, moved back by the `margin` the
    /// deployment's clocks need and by what the grant's lease is shorter
    /// than the hold's own, so that the hold ends with the grant's lease
    /// and its first renewal is due at once, which lengthens it. `None`
    /// where the clock cannot go that far back.
    pub(crate) fn counted_from(&self, mode: LeaseMode, margin: Duration) -> Option<Instant> {
        earlier(self.mark.sent, margin).checked_sub(mode.lease().saturating_sub(self.mark.lease))
    }
}

/// Has the grants of `context`'s client that found no parked waiter (it
/// stopped waiting, or parks after a later attempt) given back, where its
/// deployment allows grants: a grant nobody took would otherwise keep
/// what it granted for the grant's lease. The give-back runs on the
/// parking hub's connection, and needs nothing of the client but its
/// settings.
pub(crate) fn give_back_unclaimed_grants(context: &Context) {
    let Some(grants) = context.backend.grants() else {
        return;
    };
    let settings = GiveBackSettings {
        prefix: context.config.prefix.clone(),
        baton_ttl: context.config.baton_ttl,
        lease: context.config.default_lease,
        fence_ttl: context.config.fence_ttl,
        channels: grants.prefix().to_owned(),
    };
    grants.give_back_with(Box::new(move |conn, unclaimed| {
        give_back(conn, &settings, unclaimed)
    }));
}

/// What a give-back needs of the client's settings.
#[derive(Debug)]
pub(crate) struct GiveBackSettings {
    pub(crate) prefix: String,
    pub(crate) baton_ttl: Duration,
    /// The default lease (a release script's argument, unused by a last
    /// release).
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Duration,
    /// The prefix of the clients' grant channels.
    pub(crate) channels: String,
}

/// Gives back `unclaimed` on `conn`, by what its key is: a lock's
/// ownership, a semaphore's permits, or a read-write lock's read.
fn give_back(
    conn: &mut dyn redis::ConnectionLike,
    settings: &GiveBackSettings,
    unclaimed: Unclaimed<'_>,
) -> redis::RedisResult<()> {
    if let Some(keys) = keys::lock_keys_of(&settings.prefix, unclaimed.key) {
        return lock::give_back(conn, settings, &keys, unclaimed);
    }
    if let Some(keys) = keys::semaphore_keys_of(&settings.prefix, unclaimed.key) {
        return semaphore::give_back(conn, settings, &keys, unclaimed);
    }
    if let Some(keys) = keys::rwlock_keys_of(&settings.prefix, unclaimed.key) {
        return rwlock::give_back(conn, settings, &keys, unclaimed);
    }
    log::warn!(
        "redbaton: a grant of {:?}, which nothing of this client's prefix holds, was left",
        unclaimed.key
    );
    Ok(())
}

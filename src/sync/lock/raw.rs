//! The lock's Redis protocol behind one trait, [`RawLock`], as lock_api's
//! `RawMutex` sits under `Mutex`: every exchange returns data (acquired
//! with a fence, held with a lease left, a depth left), never a guard. The
//! handle, the guard, the wait loop and the watchdog work against the
//! trait, so that another implementation (a quorum over several masters)
//! drops in without touching them.
//!
//! [`SingleServer`] speaks it to one [`Backend`] through the scripts of
//! `scripts/lock/`.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ServerErrorKind, Value};

use crate::backend::{is_transient_reply, Backend, Failed, Sent};
use crate::error::Error;
use crate::keys::LockKeys;
use crate::lease::{Cleanup, RenewLeases, RenewOutcome, RenewRequest};
use crate::scripts::lock::{self as calls, AcquireArgs, HandoffArgs};
use crate::scripts::reply::{AcquireReply, Done, HandoffReply, HolderReply, ReleaseReply};
use crate::scripts::Call;

/// A lock holder's identity, from [`Holder::owner`]: the client instance
/// and the thread. Its text form is for logs and comparisons; its layout
/// may change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(String);

impl Owner {
    /// The identity as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds a lock, from [`Lock::holder`](crate::Lock::holder).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's identity.
    pub owner: Owner,
    /// Re-entry depth: how many guards the holder has.
    pub depth: u32,
    /// The fencing token of this ownership.
    pub fencing_token: u64,
    /// Time left on the lease; `None` if the key has no expiry.
    pub remaining_lease: Option<Duration>,
}

/// The lock protocol: what one lock name's exchanges with Redis are.
pub(crate) trait RawLock: RenewLeases {
    /// Takes, re-enters, or reports the holder's lease left.
    fn attempt(&self, keys: &LockKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed>;

    /// Releases one level of the ownership `fence` of `identity`, which
    /// keeps `guards_left` guards and whose lease is `lease`.
    fn release(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        guards_left: usize,
        lease: Duration,
    ) -> Result<Sent<ReleaseReply>, Failed>;

    /// Passes the ownership straight to a local waiter.
    fn hand_off(
        &self,
        keys: &LockKeys,
        args: HandoffArgs<'_>,
    ) -> Result<Sent<HandoffReply>, Failed>;

    /// Makes the ownership live at least `lease` more: whether it was
    /// still `identity`'s under `fence`.
    fn renew(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, Error>;

    /// Undoes the ownership that request `request` may have made for
    /// `identity`, if it is still there.
    fn undo_request(&self, keys: &LockKeys, identity: &str, request: u64) -> Result<(), Error>;

    /// Who holds the lock.
    fn holder(&self, keys: &LockKeys) -> Result<Option<Holder>, Error>;

    /// Whether anyone holds it.
    fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error>;

    /// Removes it whoever holds it; whether there was one.
    fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error>;
}

/// A clean-up that sends the last release of an ownership again until
/// Redis answers (or its lease, at most `lease` from `sent`, has ended).
pub(crate) fn release_later(
    raw: &Arc<dyn RawLock>,
    keys: &Arc<LockKeys>,
    identity: &Arc<str>,
    fence: u64,
    lease: Duration,
    sent: Instant,
) -> Cleanup {
    let (raw, keys, identity) = (Arc::clone(raw), Arc::clone(keys), Arc::clone(identity));
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.release(&keys, &identity, fence, 0, lease)
            .map(drop)
            .map_err(|failed| failed.error)
    })
}

/// A clean-up that undoes request `request` of `identity` until Redis
/// answers (or the lease it may have set, `lease` from `sent`, has ended).
pub(crate) fn undo_later(
    raw: &Arc<dyn RawLock>,
    keys: &Arc<LockKeys>,
    identity: &Arc<str>,
    request: u64,
    lease: Duration,
    sent: Instant,
) -> Cleanup {
    let (raw, keys, identity) = (Arc::clone(raw), Arc::clone(keys), Arc::clone(identity));
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.undo_request(&keys, &identity, request)
    })
}

/// The lock protocol on one server (today's only backend flavor; Cluster
/// and Sentinel route the same exchanges).
#[derive(Debug)]
pub(crate) struct SingleServer {
    backend: Arc<Backend>,
    baton_ttl: Duration,
    /// Whether the renewal script is known to be loaded: the first round
    /// loads it up front instead of failing once per lock.
    renew_loaded: AtomicBool,
}

impl SingleServer {
    pub(crate) fn new(backend: Arc<Backend>, baton_ttl: Duration) -> Self {
        SingleServer {
            backend,
            baton_ttl,
            renew_loaded: AtomicBool::new(false),
        }
    }

    fn call<T: redis::FromRedisValue>(
        &self,
        keys: &LockKeys,
        call: &Call,
    ) -> Result<Sent<T>, Failed> {
        self.backend.exchange(&keys.name, |c| call.invoke(c))
    }
}

impl RawLock for SingleServer {
    fn attempt(&self, keys: &LockKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed> {
        self.call(keys, &calls::acquire(keys, args))
            .map(|sent| sent.value)
    }

    fn release(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        guards_left: usize,
        lease: Duration,
    ) -> Result<Sent<ReleaseReply>, Failed> {
        let call = calls::release(keys, identity, fence, guards_left, lease, self.baton_ttl);
        self.call(keys, &call)
    }

    fn hand_off(
        &self,
        keys: &LockKeys,
        args: HandoffArgs<'_>,
    ) -> Result<Sent<HandoffReply>, Failed> {
        self.call(keys, &calls::handoff(keys, args))
    }

    fn renew(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        let call = calls::renew(keys, identity, fence, lease);
        let Done(renewed) = self.backend.run(&keys.name, |c| call.invoke(c))?;
        Ok(renewed)
    }

    fn undo_request(&self, keys: &LockKeys, identity: &str, request: u64) -> Result<(), Error> {
        let call = calls::release_request(keys, identity, request, self.baton_ttl);
        let Done(_) = self.backend.run(&keys.name, |c| call.invoke(c))?;
        Ok(())
    }

    fn holder(&self, keys: &LockKeys) -> Result<Option<Holder>, Error> {
        let call = calls::holder(keys);
        let HolderReply(row) = self.backend.run(&keys.name, |c| call.invoke(c))?;
        Ok(row.map(|row| Holder {
            owner: Owner(row.owner),
            depth: row.depth,
            fencing_token: row.fence,
            remaining_lease: row.lease_left,
        }))
    }

    fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error> {
        self.backend.run(&keys.name, |c| {
            redis::cmd("EXISTS").arg(&keys.lock).query(c)
        })
    }

    fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error> {
        let call = calls::force_unlock(keys, self.baton_ttl);
        let Done(removed) = self.backend.run(&keys.name, |c| call.invoke(c))?;
        Ok(removed)
    }
}

impl RenewLeases for SingleServer {
    /// One pipeline for the whole round. Renewal is idempotent, so sending
    /// it again (after `NOSCRIPT`, or on a fresh connection after a dropped
    /// one) is safe.
    fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome> {
        let calls: Vec<Call> = requests
            .iter()
            .map(|r| calls::renew(r.keys, r.identity, r.fence, r.lease))
            .collect();
        let Some(first) = calls.first() else {
            return Vec::new();
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for call in &calls {
            call.add_to(&mut pipe);
        }
        let forgot = |values: &[Value]| {
            values.iter().any(|value| {
                matches!(value, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript))
            })
        };
        let replies = self.backend.run("(watchdog renewal)", |c| {
            if !self.renew_loaded.load(Ordering::Relaxed) {
                first.load(c)?;
                self.renew_loaded.store(true, Ordering::Relaxed);
            }
            let values: Vec<Value> = pipe.query(c)?;
            if !forgot(&values) {
                return Ok(values);
            }
            first.load(c)?;
            pipe.query(c)
        });
        match replies {
            Ok(values) => values.iter().map(renew_outcome).collect(),
            Err(err) => {
                log::warn!("redbaton: watchdog renewal failed: {err}");
                vec![RenewOutcome::Retry; requests.len()]
            }
        }
    }
}

fn renew_outcome(value: &Value) -> RenewOutcome {
    match value {
        Value::Int(1) => RenewOutcome::Renewed,
        // "Not now": try again, as when Redis is out of reach.
        Value::ServerError(err) if is_transient_reply(Some(err.code())) => RenewOutcome::Retry,
        // 0: not this ownership any more. Any other error reply (say
        // WRONGTYPE: something else overwrote the key) means the same.
        _ => RenewOutcome::Lost,
    }
}

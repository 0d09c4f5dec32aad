//! The read-write lock's Redis protocol: every exchange returns data
//! (acquired with a token, refused with a time to wait, a depth left),
//! never a guard. [`RawRwLock`] speaks it to one deployment's [`Backend`]
//! through the scripts of `scripts/rwlock/`; [`RwRenewer`] is how the
//! watchdog renews read, upgradable and write holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ServerErrorKind, Value};

use crate::backend::{Backend, Failed, Sent};
use crate::config::{Config, ReplicaAcks};
use crate::error::Error;
use crate::keys::RwKeys;
use crate::lease::confirm;
use crate::lease::{
    is_redirection, renew_by_shard, renew_outcome, Cleanup, RenewLeases, RenewOutcome, RenewRequest,
};
use crate::scripts::lock as lock_calls;
use crate::scripts::reply::{Done, ReleaseReply};
use crate::scripts::rwlock::{
    self as calls, ReadArgs, RwAcquireReply, UpgradableArgs, UpgradeArgs, WriteArgs, WriteGrants,
};
use crate::scripts::Call;

/// How much longer than one park a waiting writer's place lasts: time for
/// the park to end late (on the server's timer tick) and for the next
/// attempt, which renews the place, to arrive.
pub(crate) const PLACE_MARGIN: Duration = Duration::from_millis(500);

/// Which kind of hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    /// The upgradable read: one holder at a time, beside plain readers.
    Upgradable,
    Write,
}

/// The read-write lock protocol on one Redis deployment (one server, a
/// cluster, a master behind sentinels): the backend routes by the lock's
/// keys, which share a slot.
#[derive(Debug)]
pub(crate) struct RawRwLock {
    backend: Arc<Backend>,
    baton_ttl: Duration,
    fence_ttl: Duration,
    /// How long a waiting writer's place lasts from each attempt.
    place: Duration,
    /// `replica_acks`: the replicas that must confirm each fresh hold and
    /// each last release.
    acks: Option<ReplicaAcks>,
    /// Whether the read renewal script is known to be loaded: a round
    /// loads it up front instead of failing once per hold.
    renew_loaded: AtomicBool,
    /// Where the deployment allows grants: the prefix of the clients'
    /// grant channels, on which a writer's last release grants the read to
    /// the waiting readers that left a spec, and a last release the write
    /// hold to a waiting writer that left one.
    grants: Option<String>,
}

impl RawRwLock {
    pub(crate) fn new(backend: Arc<Backend>, config: &Config) -> Self {
        RawRwLock {
            baton_ttl: config.baton_ttl,
            fence_ttl: config.fence_ttl,
            place: config.max_park.saturating_add(PLACE_MARGIN),
            acks: config.replica_acks,
            renew_loaded: AtomicBool::new(false),
            grants: backend.grants().map(|grants| grants.prefix().to_owned()),
            backend,
        }
    }

    /// Whether a release may grant a waiter of this client the read or the
    /// write hold (the deployment allows grants, and a grant reaches a
    /// waiter parked now, see [`Backend::takes_grants`]).
    pub(crate) fn takes_grants(&self) -> bool {
        self.grants.is_some() && self.backend.takes_grants()
    }

    /// What a release needs to grant the write hold, where grants come.
    fn write_grants(&self) -> Option<WriteGrants<'_>> {
        self.grants.as_deref().map(|channels| WriteGrants {
            channels,
            fence_ttl: self.fence_ttl,
        })
    }

    pub(crate) fn baton_ttl(&self) -> Duration {
        self.baton_ttl
    }

    pub(crate) fn fence_ttl(&self) -> Duration {
        self.fence_ttl
    }

    /// How long a waiting writer's place lasts from each of its attempts.
    pub(crate) fn place(&self) -> Duration {
        self.place
    }

    fn call<T: redis::FromRedisValue>(
        &self,
        keys: &RwKeys,
        call: &Call,
    ) -> Result<Sent<T>, Failed> {
        self.backend
            .exchange(&keys.write, &keys.name, |c| call.invoke(c))
    }

    /// Takes, re-enters, or reports how long to wait for a read hold.
    pub(crate) fn read(&self, keys: &RwKeys, args: ReadArgs<'_>) -> Result<RwAcquireReply, Failed> {
        let call = calls::read(keys, args);
        self.acquire_confirmed(keys, &call, args.identity, args.request)
    }

    /// Takes, re-enters, or reports how long to wait for the write hold.
    pub(crate) fn write(
        &self,
        keys: &RwKeys,
        args: WriteArgs<'_>,
    ) -> Result<RwAcquireReply, Failed> {
        let call = calls::write(keys, args);
        self.acquire_confirmed(keys, &call, args.identity, args.request)
    }

    /// Takes, re-enters, or reports how long to wait for the upgradable
    /// read.
    pub(crate) fn upgradable(
        &self,
        keys: &RwKeys,
        args: UpgradableArgs<'_>,
    ) -> Result<RwAcquireReply, Failed> {
        let call = calls::upgradable(keys, args);
        self.acquire_confirmed(keys, &call, args.identity, args.request)
    }

    /// The upgradable reader takes the write hold, or reports how long
    /// until the other readers may have left (marking that it waits when
    /// `args.mark` says so).
    pub(crate) fn upgrade(
        &self,
        keys: &RwKeys,
        args: UpgradeArgs<'_>,
    ) -> Result<RwAcquireReply, Failed> {
        let call = calls::upgrade(keys, args);
        self.acquire_confirmed(keys, &call, args.identity, args.request)
    }

    /// Takes the waiting-upgrade mark of the upgradable hold `token` of
    /// `identity` off; whether it was there.
    pub(crate) fn cancel_upgrade(
        &self,
        keys: &RwKeys,
        identity: &str,
        token: u64,
    ) -> Result<bool, Error> {
        let call = calls::cancel_upgrade(keys, identity, token, self.baton_ttl);
        let Done(removed) = self
            .backend
            .run(&keys.write, &keys.name, |c| call.invoke(c))?;
        Ok(removed)
    }

    /// Sends an acquisition; under `replica_acks`, a fresh hold is then
    /// confirmed with `WAIT` on the same connection, and one too few
    /// replicas have is undone there at once ([`Error::NotReplicated`],
    /// transient: a waiter tries again), as the lock's are: a hold only
    /// the master has is lost in a failover, and the promoted replica
    /// would let another writer in beside its holder. A re-entry adds
    /// nothing a promoted replica would need.
    fn acquire_confirmed(
        &self,
        keys: &RwKeys,
        call: &Call,
        identity: &str,
        request: u64,
    ) -> Result<RwAcquireReply, Failed> {
        let Some(acks) = self.acks else {
            return self.call(keys, call).map(|sent| sent.value);
        };
        let undo = calls::undo(keys, identity, request, self.baton_ttl);
        let sent = self.backend.exchange(&keys.write, &keys.name, |c| {
            let reply: RwAcquireReply = call.invoke(c)?;
            if !matches!(reply, RwAcquireReply::Acquired { depth: 1, .. }) {
                return Ok((reply, None));
            }
            let acknowledged = confirm::wait(c, acks)?;
            if acknowledged >= acks.replicas {
                return Ok((reply, None));
            }
            let Done(_) = undo.invoke(c)?;
            Ok((reply, Some(acknowledged)))
        })?;
        match sent.value {
            (reply, None) => Ok(reply),
            (_, Some(acknowledged)) => Err(Failed {
                error: confirm::not_replicated(&self.backend, acks, acknowledged),
                outcome_unknown: false,
            }),
        }
    }

    /// Releases one level of a hold of `kind` (`token`: its token or
    /// fencing token) that keeps `guards_left` guards.
    pub(crate) fn release(
        &self,
        keys: &RwKeys,
        kind: Kind,
        identity: &str,
        token: u64,
        guards_left: usize,
        lease: Duration,
    ) -> Result<Sent<ReleaseReply>, Failed> {
        let call = self.release_call(keys, kind, identity, token, guards_left, lease);
        // Under `replica_acks` the last release is confirmed: one that
        // only this master has is lost if a replica is promoted, which then
        // keeps the hold for its lease.
        let last = |reply: &ReleaseReply| matches!(reply, ReleaseReply::Released);
        self.call_confirmed(keys, &call, last)
    }

    /// The release of one level of a hold of `kind`.
    fn release_call(
        &self,
        keys: &RwKeys,
        kind: Kind,
        identity: &str,
        token: u64,
        guards_left: usize,
        lease: Duration,
    ) -> Call {
        let baton_ttl = self.baton_ttl;
        let grants = self.write_grants();
        match kind {
            Kind::Read => {
                calls::release_read(keys, identity, token, guards_left, lease, baton_ttl, grants)
            }
            Kind::Upgradable => calls::release_upgradable(
                keys,
                identity,
                token,
                guards_left,
                lease,
                baton_ttl,
                grants,
            ),
            Kind::Write => {
                calls::release_write(keys, identity, token, guards_left, lease, baton_ttl, grants)
            }
        }
    }

    /// Makes the hold of `kind` `token` (a read hold's token, a write or
    /// upgradable hold's fencing token) of `identity` live `lease` more,
    /// if it is still there (whether it was).
    pub(crate) fn renew(
        &self,
        keys: &RwKeys,
        kind: Kind,
        identity: &str,
        token: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        let call = match kind {
            Kind::Read => {
                calls::renew_read(&keys.readers, &keys.read_depths, identity, token, lease)
            }
            Kind::Upgradable => lock_calls::renew(&keys.upgradable, identity, token, lease),
            Kind::Write => lock_calls::renew(&keys.write, identity, token, lease),
        };
        self.backend
            .run(&keys.write, &keys.name, |c| call.invoke::<Done>(c))
            .map(|Done(renewed)| renewed)
    }

    /// Takes the read grant spec of `identity` off (a waiting reader that
    /// stops waiting unserved): a writer's release would grant it a read
    /// it would give back.
    pub(crate) fn withdraw_read_spec(&self, keys: &RwKeys, identity: &str) -> Result<(), Error> {
        self.backend.run(&keys.write, &keys.name, |c| {
            redis::cmd("HDEL")
                .arg(&keys.read_grants)
                .arg(identity)
                .query::<()>(c)
        })
    }

    /// Sends the last release of a hold again (for a clean-up): done once
    /// the current master does not have the hold and, under
    /// `replica_acks`, its replicas confirm that.
    fn release_again(
        &self,
        keys: &RwKeys,
        kind: Kind,
        identity: &str,
        token: u64,
        lease: Duration,
    ) -> Result<(), Error> {
        let call = self.release_call(keys, kind, identity, token, 0, lease);
        // "Not the owner" is confirmed too: the earlier release may be on
        // this master only.
        self.call_confirmed(keys, &call, |_: &ReleaseReply| true)
            .map(drop)
            .map_err(|failed| failed.error)
    }

    /// `call`, then under `replica_acks`, when `confirm` says so, `WAIT`.
    fn call_confirmed<T: redis::FromRedisValue>(
        &self,
        keys: &RwKeys,
        call: &Call,
        confirm: impl Fn(&T) -> bool,
    ) -> Result<Sent<T>, Failed> {
        confirm::exchange_confirmed(
            &self.backend,
            &keys.write,
            &keys.name,
            self.acks,
            confirm,
            |c| call.invoke(c),
        )
    }

    /// Removes the waiting writer `identity`'s place; whether it was there.
    pub(crate) fn withdraw(&self, keys: &RwKeys, identity: &str) -> Result<bool, Error> {
        let call = calls::withdraw(keys, identity, self.baton_ttl);
        let Done(removed) = self
            .backend
            .run(&keys.write, &keys.name, |c| call.invoke(c))?;
        Ok(removed)
    }

    /// Frees what request `request` of `identity` may have taken.
    fn undo(&self, keys: &RwKeys, identity: &str, request: u64) -> Result<(), Error> {
        let call = calls::undo(keys, identity, request, self.baton_ttl);
        self.call_confirmed(keys, &call, |_: &Done| true)
            .map(drop)
            .map_err(|failed| failed.error)
    }

    /// Renews `requests` (all of `kind`, on one server) in one pipeline.
    fn renew_shard(&self, kind: Kind, requests: &[&RenewRequest<'_>]) -> Vec<RenewOutcome> {
        let calls: Vec<Option<Call>> = requests.iter().map(|r| renew_call(kind, r)).collect();
        let mut outcomes = vec![RenewOutcome::Lost; requests.len()];
        let sendable: Vec<(usize, &Call)> = calls
            .iter()
            .enumerate()
            .filter_map(|(i, call)| call.as_ref().map(|call| (i, call)))
            .collect();
        let Some(&(first_index, first)) = sendable.first() else {
            return outcomes;
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (_, call) in &sendable {
            call.add_to(&mut pipe);
        }
        let forgot = |values: &[Value]| {
            values.iter().any(|value| {
                matches!(value, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript))
            })
        };
        let loaded = match kind {
            Kind::Read => Some(&self.renew_loaded),
            // The lock's renewal script: loaded by the first NOSCRIPT.
            Kind::Upgradable | Kind::Write => None,
        };
        let replies = self
            .backend
            .run(requests[first_index].key, "(watchdog renewal)", |c| {
                if let Some(loaded) = loaded.filter(|l| !l.load(Ordering::Relaxed)) {
                    first.load(c)?;
                    loaded.store(true, Ordering::Relaxed);
                }
                let values: Vec<Value> = pipe.query(c)?;
                if !forgot(&values) {
                    return Ok(values);
                }
                first.load(c)?;
                pipe.query(c)
            });
        let values = match replies {
            Ok(values) => values,
            Err(err) => {
                log::warn!("redbaton: watchdog renewal of read-write locks failed: {err}");
                return vec![RenewOutcome::Retry; requests.len()];
            }
        };
        for ((i, call), value) in sendable.iter().zip(values) {
            outcomes[*i] = if is_redirection(&value) {
                // The slot moved, or is moving: this one alone, following
                // the redirection (which reloads the map for a `MOVED`).
                let r = requests[*i];
                match self.backend.run(r.key, r.name, |c| call.invoke::<Done>(c)) {
                    Ok(Done(true)) => RenewOutcome::Renewed,
                    Ok(Done(false)) => RenewOutcome::Lost,
                    Err(_) => RenewOutcome::Retry,
                }
            } else {
                renew_outcome(&value)
            };
        }
        outcomes
    }
}

/// The renewal of one hold; `None` when its key is not one of ours.
fn renew_call(kind: Kind, r: &RenewRequest<'_>) -> Option<Call> {
    match kind {
        Kind::Read => {
            let depths = RwKeys::depths_beside(r.key)?;
            Some(calls::renew_read(
                r.key, &depths, r.identity, r.fence, r.lease,
            ))
        }
        // A write or upgradable hold is a lock hash (flag, fence): the
        // lock's renewal.
        Kind::Upgradable | Kind::Write => {
            Some(lock_calls::renew(r.key, r.identity, r.fence, r.lease))
        }
    }
}

/// A clean-up that undoes request `request` of `identity` until Redis
/// answers (or the lease it may have set, `lease` from `sent`, has ended).
pub(crate) fn undo_later(
    raw: &Arc<RawRwLock>,
    keys: &Arc<RwKeys>,
    identity: &Arc<str>,
    request: u64,
    lease: Duration,
    sent: Instant,
) -> Cleanup {
    let (raw, keys, identity) = (Arc::clone(raw), Arc::clone(keys), Arc::clone(identity));
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.undo(&keys, &identity, request)
    })
}

/// A clean-up that sends the last release of a hold again until Redis
/// answers (or its lease, at most `lease` from `sent`, has ended).
pub(crate) fn release_later(
    raw: &Arc<RawRwLock>,
    keys: &Arc<RwKeys>,
    kind: Kind,
    identity: &Arc<str>,
    token: u64,
    lease: Duration,
    sent: Instant,
) -> Cleanup {
    let (raw, keys, identity) = (Arc::clone(raw), Arc::clone(keys), Arc::clone(identity));
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.release_again(&keys, kind, &identity, token, lease)
    })
}

/// How the watchdog renews the holds of one kind: a read hold's lease is
/// its score in the readers set, an upgradable or write hold's the TTL of
/// its key.
#[derive(Debug)]
pub(crate) struct RwRenewer {
    pub(crate) raw: Arc<RawRwLock>,
    pub(crate) kind: Kind,
}

impl RenewLeases for RwRenewer {
    /// One pipeline per server for the whole round. Renewal is
    /// idempotent, so sending it again is safe.
    fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome> {
        renew_by_shard(&self.raw.backend, requests, |batch| {
            self.raw.renew_shard(self.kind, batch)
        })
    }
}

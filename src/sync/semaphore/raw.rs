//! The semaphore's Redis protocol behind one trait, [`RawSemaphore`]: every
//! exchange returns data (acquired, short with a lease left, released, not
//! held), never a permit guard. The handle, the guard and the watchdog work
//! against the trait.
//!
//! [`DeploymentSemaphore`] speaks it to one [`Backend`] (one server, a
//! cluster, a sentinel-watched master) through the scripts of
//! `scripts/semaphore/`. On a quorum of independent masters every exchange
//! fails with [`Error::WrongTopology`]: a semaphore needs one deployment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ServerErrorKind, Value};

use crate::backend::{Backend, Failed, Sent};
use crate::config::{Config, ReplicaAcks};
use crate::error::Error;
use crate::keys::SemaphoreKeys;
use crate::lease::confirm;
use crate::lease::{
    is_redirection, renew_by_shard, renew_outcome, Cleanup, RenewLeases, RenewOutcome, RenewRequest,
};
use crate::scripts::semaphore::{
    self as calls, AcquireArgs, AcquireReply, Adjust, Refusal, ReleaseReply, StateReply, TotalReply,
};
use crate::scripts::Call;

/// The semaphore protocol: what one semaphore's exchanges with Redis are.
pub(crate) trait RawSemaphore: RenewLeases {
    /// Sets the total unless one is in force.
    fn set_permits(&self, keys: &SemaphoreKeys, total: u64) -> Result<TotalReply, Error>;

    /// Moves the total by `permits`; `request` makes a resend count once.
    fn adjust(
        &self,
        keys: &SemaphoreKeys,
        way: Adjust,
        permits: u64,
        request: &str,
    ) -> Result<TotalReply, Error>;

    /// The total and the permits available now.
    fn state(&self, keys: &SemaphoreKeys) -> Result<StateReply, Error>;

    /// Takes permits under a new permit id, or says when to look again.
    fn attempt(&self, keys: &SemaphoreKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed>;

    /// Returns the permits of permit id `id`.
    fn release(&self, keys: &SemaphoreKeys, id: &str) -> Result<Sent<ReleaseReply>, Failed>;

    /// Returns the permits of `id` again (for a clean-up): done once the
    /// current master does not have them and, under `replica_acks`, its
    /// replicas confirm that.
    fn release_again(&self, keys: &SemaphoreKeys, id: &str) -> Result<(), Error> {
        self.release(keys, id)
            .map(drop)
            .map_err(|failed| failed.error)
    }

    /// Gives up the waiter's `place` (it stopped waiting).
    fn leave(&self, keys: &SemaphoreKeys, place: &str) -> Result<(), Error>;

    /// Makes permit id `id` live at least `lease` more, if it still holds
    /// its permits (whether it did).
    fn renew(&self, keys: &SemaphoreKeys, id: &str, lease: Duration) -> Result<bool, Error>;
}

/// The error for a script's refusal on semaphore `keys`, for a caller that
/// asked for `permits`.
pub(crate) fn refused(keys: &SemaphoreKeys, refusal: Refusal, permits: u64) -> Error {
    match refusal {
        Refusal::NotSet => Error::SemaphoreNotSet {
            name: keys.name.clone(),
        },
        Refusal::OverCapacity { total } => Error::PermitsOverCapacity {
            name: keys.name.clone(),
            permits,
            capacity: total,
        },
        Refusal::Damaged { field } => Error::WrongType {
            name: keys.name.clone(),
            detail: format!(
                "the semaphore state {} has a missing or malformed {field}",
                keys.state
            ),
        },
    }
}

/// A clean-up that returns the permits of `id` until Redis answers (or
/// their lease, at most `lease` from `sent`, has ended anyway): for a
/// release that failed, and for an acquisition whose reply was lost (it
/// may have taken permits for nobody).
pub(crate) fn release_later(
    raw: &Arc<dyn RawSemaphore>,
    keys: &Arc<SemaphoreKeys>,
    id: &Arc<str>,
    lease: Duration,
    sent: Instant,
) -> Cleanup {
    let (raw, keys, id) = (Arc::clone(raw), Arc::clone(keys), Arc::clone(id));
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.release_again(&keys, &id)
    })
}

/// Gives back on `conn` the permits a release granted to `id`, a waiter
/// of this client that was not parked for them (it stopped waiting, or is
/// on its way to its next attempt, which puts its place back): a release
/// like its holder's, which grants or wakes the waiters they serve, while
/// their lease still ends at `ends`, the grant's (else the waiter took
/// them since, see `release.lua`).
pub(crate) fn give_back(
    conn: &mut dyn redis::ConnectionLike,
    keys: &SemaphoreKeys,
    id: &str,
    ends: &str,
    baton_ttl: Duration,
    channels: &str,
) -> redis::RedisResult<()> {
    calls::give_back(keys, id, ends, baton_ttl, channels)
        .invoke::<Value>(conn)
        .map(drop)
}

/// The semaphore protocol on one Redis deployment.
#[derive(Debug)]
pub(crate) struct DeploymentSemaphore {
    backend: Arc<Backend>,
    baton_ttl: Duration,
    /// `replica_acks`: the replicas that must confirm each acquisition.
    acks: Option<ReplicaAcks>,
    /// Whether the renewal script is known to be loaded.
    renew_loaded: AtomicBool,
    /// Where the deployment allows grants: the prefix of the clients'
    /// grant channels (see `release.lua`).
    grants: Option<String>,
}

impl DeploymentSemaphore {
    pub(crate) fn new(backend: Arc<Backend>, config: &Config) -> Self {
        DeploymentSemaphore {
            baton_ttl: config.baton_ttl,
            acks: config.replica_acks,
            renew_loaded: AtomicBool::new(false),
            grants: backend.grants().map(|grants| grants.prefix().to_owned()),
            backend,
        }
    }

    /// The release of `id`, which grants the permits it frees where the
    /// deployment allows.
    fn release_call(&self, keys: &SemaphoreKeys, id: &str) -> Call {
        calls::release(keys, id, self.baton_ttl, self.grants.as_deref())
    }

    fn run<T: redis::FromRedisValue>(&self, keys: &SemaphoreKeys, call: &Call) -> Result<T, Error> {
        self.backend
            .run(&keys.state, &keys.name, |c| call.invoke(c))
    }

    /// Renews `requests`, whose keys live on one server, in one pipeline.
    fn renew_shard(&self, requests: &[&RenewRequest<'_>]) -> Vec<RenewOutcome> {
        let calls: Vec<Call> = requests
            .iter()
            .map(|r| calls::renew(r.key, r.identity, r.lease))
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
        let replies = self
            .backend
            .run(requests[0].key, "(watchdog renewal)", |c| {
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
        let values = match replies {
            Ok(values) => values,
            Err(err) => {
                log::warn!("redbaton: watchdog renewal of semaphore permits failed: {err}");
                return vec![RenewOutcome::Retry; requests.len()];
            }
        };
        let mut outcomes = Vec::with_capacity(requests.len());
        for (request, value) in requests.iter().zip(&values) {
            outcomes.push(if is_redirection(value) {
                // The slot moved, or is moving: renew this one alone,
                // which follows the redirection (and reloads the map for
                // a `MOVED`, not for an `ASK`).
                let call = calls::renew(request.key, request.identity, request.lease);
                match self
                    .backend
                    .run(request.key, request.name, |c| call.invoke::<i64>(c))
                {
                    Ok(1) => RenewOutcome::Renewed,
                    Ok(_) => RenewOutcome::Lost,
                    Err(_) => RenewOutcome::Retry,
                }
            } else {
                renew_outcome(value)
            });
        }
        outcomes
    }
}

impl RawSemaphore for DeploymentSemaphore {
    fn set_permits(&self, keys: &SemaphoreKeys, total: u64) -> Result<TotalReply, Error> {
        self.run(keys, &calls::set(keys, total, self.baton_ttl))
    }

    fn adjust(
        &self,
        keys: &SemaphoreKeys,
        way: Adjust,
        permits: u64,
        request: &str,
    ) -> Result<TotalReply, Error> {
        let call = calls::adjust(keys, way, permits, request, self.baton_ttl);
        self.run(keys, &call)
    }

    fn state(&self, keys: &SemaphoreKeys) -> Result<StateReply, Error> {
        self.run(keys, &calls::state(keys, self.baton_ttl))
    }

    fn attempt(&self, keys: &SemaphoreKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed> {
        let call = calls::acquire(keys, args, self.baton_ttl);
        let undo = self.release_call(keys, args.id);
        let acks = self.acks;
        let sent = self.backend.exchange(&keys.state, &keys.name, |c| {
            let reply: AcquireReply = call.invoke(c)?;
            let Some(acks) = acks.filter(|_| matches!(reply, AcquireReply::Acquired { .. })) else {
                return Ok((reply, None));
            };
            // WAIT counts the replicas that have every write of this
            // connection, the acquisition included.
            let acknowledged = confirm::wait(c, acks)?;
            if acknowledged >= acks.replicas {
                return Ok((reply, None));
            }
            let _: ReleaseReply = undo.invoke(c)?;
            Ok((reply, Some(acknowledged)))
        })?;
        match sent.value {
            (reply, None) => Ok(reply),
            (_, Some(acknowledged)) => {
                let acks = acks.unwrap_or(ReplicaAcks {
                    replicas: 0,
                    timeout: Duration::ZERO,
                });
                Err(Failed {
                    error: Error::NotReplicated {
                        addr: self.backend.addr().to_owned(),
                        wanted: acks.replicas,
                        acknowledged,
                        timeout: acks.timeout,
                    },
                    outcome_unknown: false,
                })
            }
        }
    }

    fn release(&self, keys: &SemaphoreKeys, id: &str) -> Result<Sent<ReleaseReply>, Failed> {
        let call = self.release_call(keys, id);
        // Under `replica_acks` a release is confirmed: one that only this
        // master has is lost if a replica is promoted, which then keeps
        // the permits taken for their lease.
        let released = |reply: &ReleaseReply| matches!(reply, ReleaseReply::Released { .. });
        confirm::exchange_confirmed(
            &self.backend,
            &keys.state,
            &keys.name,
            self.acks,
            released,
            |c| call.invoke(c),
        )
    }

    fn release_again(&self, keys: &SemaphoreKeys, id: &str) -> Result<(), Error> {
        let call = self.release_call(keys, id);
        // "Not held" is confirmed too: the earlier release may be on this
        // master only.
        let answered = |reply: &ReleaseReply| !matches!(reply, ReleaseReply::Refused(_));
        confirm::exchange_confirmed(
            &self.backend,
            &keys.state,
            &keys.name,
            self.acks,
            answered,
            |c| call.invoke(c),
        )
        .map(drop)
        .map_err(|failed| failed.error)
    }

    fn leave(&self, keys: &SemaphoreKeys, place: &str) -> Result<(), Error> {
        let mut pipe = redis::pipe();
        pipe.cmd("ZREM").arg(&keys.waiters).arg(place).ignore();
        if self.grants.is_some() {
            // Its spec too: a release would grant it permits it gives back.
            pipe.cmd("HDEL").arg(&keys.grant_specs).arg(place).ignore();
        }
        self.backend
            .run(&keys.waiters, &keys.name, |c| pipe.query(c))
    }

    fn renew(&self, keys: &SemaphoreKeys, id: &str, lease: Duration) -> Result<bool, Error> {
        let call = calls::renew(&keys.holders, id, lease);
        self.backend
            .run(&keys.holders, &keys.name, |c| call.invoke::<i64>(c))
            .map(|renewed| renewed == 1)
    }
}

impl RenewLeases for DeploymentSemaphore {
    /// One pipeline per server for the whole round. Renewal is idempotent,
    /// so sending it again is safe.
    fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome> {
        renew_by_shard(&self.backend, requests, |batch| self.renew_shard(batch))
    }
}

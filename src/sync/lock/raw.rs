//! The lock's Redis protocol behind one trait, [`RawLock`], as lock_api's
//! `RawMutex` sits under `Mutex`: every exchange returns data (acquired
//! with a fence, held with a lease left, a depth left), never a guard. The
//! handle, the guard, the wait loop and the watchdog work against the
//! trait, so that another implementation (a quorum over several masters)
//! drops in without touching them.
//!
//! [`DeploymentLock`] speaks it to one [`Backend`] through the scripts of
//! `scripts/lock/` (and `scripts/fair/` for a fair lock's keys).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind, Value};

use crate::backend::{Backend, Failed, Sent};
use crate::config::{Config, ReplicaAcks};
use crate::error::Error;
use crate::keys::LockKeys;
use crate::lease::confirm;
use crate::lease::{
    is_redirection, renew_by_shard, renew_outcome, Cleanup, RenewLeases, RenewOutcome, RenewRequest,
};
use crate::observe::LostReason;
use crate::scripts::lock::{self as calls, AcquireArgs, HandoffArgs, ManyArgs, ManyName};
use crate::scripts::reply::{
    AcquireReply, Done, FairReply, HandoffReply, HolderReply, HolderRow, ManyReply, ParkedOn,
    ReleaseReply,
};
use crate::scripts::Call;

/// A lock holder's identity, from [`Holder::owner`]: the client instance
/// and the thread. Its text form is for logs and comparisons; its layout
/// may change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(String);

impl Owner {
    /// The owner of the thread identity `identity`, as stored in Redis.
    pub(crate) fn new(identity: String) -> Owner {
        Owner(identity)
    }

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
    /// The name of the holder's client
    /// ([`ClientBuilder::client_name`](crate::ClientBuilder::client_name),
    /// `redbaton:<hostname>:<pid>` by default), so that an operator can
    /// tell which host and process holds the lock. `None` when it is not
    /// known: on a Redlock quorum, for a client of an earlier redbaton version,
    /// or for one that made no lock call and renewed nothing for longer
    /// than its record lasts (ten minutes, or three default leases).
    pub client_name: Option<String>,
}

impl From<HolderRow> for Holder {
    fn from(row: HolderRow) -> Holder {
        Holder {
            owner: Owner(row.owner),
            depth: row.depth,
            fencing_token: row.fence,
            remaining_lease: row.lease_left,
            client_name: None,
        }
    }
}

/// The lock protocol: what one lock name's exchanges with Redis are.
pub(crate) trait RawLock: RenewLeases {
    /// Takes, re-enters, or reports the holder's lease left.
    fn attempt(&self, keys: &LockKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed>;

    /// Takes or re-enters every one of `names` (plain locks whose keys
    /// share one cluster slot, at least one) in one atomic exchange, or
    /// none of them: then reports the first name held by another (one
    /// deployment: one script; a Redlock quorum: one round of it).
    fn attempt_many(&self, names: &[ManyName<'_>], args: ManyArgs<'_>)
        -> Result<ManyReply, Failed>;

    /// Releases one level of an ownership (see [`ReleaseOne`]).
    fn release(&self, release: ReleaseOne<'_>) -> Result<Sent<ReleaseReply>, Failed>;

    /// Sends `batch` (releases of plain locks whose keys share one cluster
    /// slot, or one Redlock quorum's set): one result per release, in
    /// order. By default one release after the other; one deployment and
    /// a quorum send them together.
    fn release_many(&self, batch: &[ReleaseOne<'_>]) -> Vec<Result<Sent<ReleaseReply>, Failed>> {
        batch.iter().map(|&r| self.release(r)).collect()
    }

    /// Sends the last release of the ownership `fence` of `identity` again
    /// (for a clean-up): done once the current master does not have it,
    /// released now or before, and under `replica_acks` its replicas
    /// confirm that ([`Error::NotReplicated`] otherwise: send it again).
    /// Owner- and fence-checked, so it never frees someone else's.
    /// `answered`: what the clean-up's earlier sends achieved (a quorum's
    /// masters that answered, which are not sent it again). `served`: a
    /// fair lock's waiters whose places the release drops (see
    /// [`ReleaseOne::served`]).
    fn release_again(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
        served: &[(String, u64)],
        answered: &mut Answered,
    ) -> Result<(), Error> {
        let _ = answered;
        self.release(ReleaseOne {
            keys,
            identity,
            fence,
            guards_left: 0,
            lease,
            next_in_line: None,
            served,
        })
        .map(drop)
        .map_err(|failed| failed.error)
    }

    /// Passes the ownership straight to a local waiter (a fair lock's only
    /// when that waiter is the head of its queue, see `fair/handoff.lua`).
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
    /// `identity`, if it is still there. `answered`: as for
    /// [`RawLock::release_again`].
    fn undo_request(
        &self,
        keys: &LockKeys,
        identity: &str,
        request: u64,
        answered: &mut Answered,
    ) -> Result<(), Error>;

    /// Who holds the lock.
    fn holder(&self, keys: &LockKeys) -> Result<Option<Holder>, Error>;

    /// Whether anyone holds it.
    fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error>;

    /// Removes it whoever holds it; whether there was one.
    fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error>;

    /// Pushes one baton on the lock's list for the next waiter: a
    /// multi-lock waiter woken on this name that moves to another name of
    /// its set passes the wake-up on (this name is free, and its release's
    /// one baton went to a waiter that did not take it). Failing here only
    /// delays those waiters to the parking sweep or their next look:
    /// logged, not reported. Nothing on a quorum, whose waiters look again
    /// every `max_park`.
    fn pass_baton(&self, keys: &LockKeys) {
        let _ = keys;
    }

    /// Ends the park on `list` of a waiter of this client that a hand-off
    /// gave the lock (see `LocalQueues::reserve_parker`): in memory when it
    /// is parked now, else (it is about to park) with a token on the list,
    /// whose announcement ends the park it is starting. Failing here only
    /// delays that waiter to the end of its park: logged, not reported.
    /// Nothing on a quorum, whose waiters are never reserved so.
    fn end_park(&self, keys: &LockKeys, list: &str) {
        let _ = (keys, list);
    }

    /// A fair lock's waiter `identity` that leaves without the lock gives
    /// its place in the queue up; a plain lock's, where releases may grant,
    /// its grant (`lock/withdraw.lua`). Nothing for other locks.
    fn leave_queue(&self, keys: &LockKeys, identity: &str) -> Result<(), Error> {
        let _ = (keys, identity);
        Ok(())
    }

    /// How many waiters of a fair lock hold a place in its queue now. 0
    /// for other locks, whose waiters Redis does not record.
    fn queued(&self, keys: &LockKeys) -> Result<u64, Error> {
        let _ = keys;
        Ok(0)
    }

    /// Whether a plain lock's ownership may pass from one thread of this
    /// client to another in memory, Redis untold ([`Grant::Passed`]): so on
    /// one deployment, whose fencing counter sets tokens aside for it; not
    /// on a Redlock quorum, whose masters must agree on every token.
    ///
    /// [`Grant::Passed`]: crate::lease::Grant::Passed
    fn passes_in_memory(&self) -> bool {
        false
    }
}

/// One release of one level of an ownership: `fence` of `identity`, which
/// keeps `guards_left` guards and whose lease is `lease`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReleaseOne<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) identity: &'a str,
    pub(crate) fence: u64,
    pub(crate) guards_left: usize,
    pub(crate) lease: Duration,
    /// A fair lock's: the waiter the ownership's acquisition found first
    /// in the queue ([`calls::fair_release`]).
    pub(crate) next_in_line: Option<&'a str>,
    /// A fair lock's: the waiters the ownership was passed to in memory,
    /// with the arrivals of their places, which a last release drops.
    pub(crate) served: &'a [(String, u64)],
}

/// What a clean-up's sends of a release or an undo achieved so far: on a
/// Redlock quorum, which masters answered it (by their place; empty before
/// the first send). Nothing for one deployment, whose single answer ends
/// the clean-up.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "redlock"), allow(dead_code))]
pub(crate) struct Answered(pub(crate) Vec<bool>);

/// A clean-up that sends the last release of an ownership again until
/// Redis answers (or its lease, at most `lease` from `sent`, has ended);
/// `served`: as [`ReleaseOne::served`].
pub(crate) fn release_later(
    raw: &Arc<dyn RawLock>,
    keys: &Arc<LockKeys>,
    identity: &Arc<str>,
    fence: u64,
    lease: Duration,
    served: Vec<(String, u64)>,
    sent: Instant,
) -> Cleanup {
    let (raw, keys, identity) = (Arc::clone(raw), Arc::clone(keys), Arc::clone(identity));
    let mut answered = Answered::default();
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.release_again(&keys, &identity, fence, lease, &served, &mut answered)
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
    let mut answered = Answered::default();
    Cleanup::new(&keys.name.clone(), sent, lease, move || {
        raw.undo_request(&keys, &identity, request, &mut answered)
    })
}

/// The lock protocol on one Redis deployment: one server, a cluster (each
/// lock on its slot's master) or a master watched by sentinels; the
/// [`Backend`] routes, the exchanges are the same.
#[derive(Debug)]
pub(crate) struct DeploymentLock {
    backend: Arc<Backend>,
    baton_ttl: Duration,
    /// `replica_acks`: the replicas that must confirm each ownership write.
    acks: Option<ReplicaAcks>,
    /// Whether the renewal script is known to be loaded: the first round
    /// loads it up front instead of failing once per lock.
    renew_loaded: AtomicBool,
    /// Where the deployment allows grants: the fence counter's TTL and
    /// the prefix of the clients' grant channels (see
    /// `lib/grant.lua`).
    grants: Option<(Duration, String)>,
}

impl DeploymentLock {
    pub(crate) fn new(backend: Arc<Backend>, config: &Config) -> Self {
        DeploymentLock {
            baton_ttl: config.baton_ttl,
            acks: config.replica_acks,
            renew_loaded: AtomicBool::new(false),
            grants: backend
                .grants()
                .map(|grants| (config.fence_ttl, grants.prefix().to_owned())),
            backend,
        }
    }

    /// What a release needs to grant (see [`DeploymentLock::grants`]'s
    /// field).
    fn grants(&self) -> Option<(Duration, &str)> {
        self.grants
            .as_ref()
            .map(|(fence_ttl, prefix)| (*fence_ttl, prefix.as_str()))
    }

    fn call<T: redis::FromRedisValue>(&self, at: At<'_>, call: &Call) -> Result<Sent<T>, Failed> {
        self.backend.exchange(at.key, at.name, |c| call.invoke(c))
    }

    /// Runs `call` on the server of `keys`'s lock.
    fn run<T: redis::FromRedisValue>(&self, keys: &LockKeys, call: &Call) -> Result<T, Error> {
        self.backend.run(&keys.lock, &keys.name, |c| call.invoke(c))
    }

    /// The undo of request `request` of `identity` (a fair lock's names
    /// a waiter to wake).
    fn undo_call(&self, keys: &LockKeys, identity: &str, request: u64) -> Call {
        match &keys.fair {
            Some(fair) => calls::fair_release_request(keys, fair, identity, request),
            None => calls::release_request(keys, identity, request, self.baton_ttl, false),
        }
    }

    /// Sends `call` on the server of `keys`'s lock, confirmed with `WAIT`
    /// under `replica_acks` when `confirm` says its reply needs it.
    fn exchange_confirmed<T: redis::FromRedisValue>(
        &self,
        keys: &LockKeys,
        confirm: impl Fn(&T) -> bool,
        call: &Call,
    ) -> Result<Sent<T>, Failed> {
        confirm::exchange_confirmed(
            &self.backend,
            &keys.lock,
            &keys.name,
            self.acks,
            confirm,
            |c| call.invoke(c),
        )
    }

    /// Wakes the fair lock's waiter that a script freeing the lock named
    /// (the head of its queue), on the list it parks on: a call of its
    /// own (one per list when which is not known), because a key chosen
    /// inside a script could not be declared in its KEYS. (A release
    /// pushes the head's list itself where it can, see
    /// `fair/release.lua`.) Failing here only delays that waiter until its
    /// park ends (at most `max_park`): logged, not reported.
    fn wake(&self, keys: &LockKeys, head: Option<String>, parked_on: ParkedOn) {
        let (Some(head), Some(fair)) = (head, &keys.fair) else {
            return;
        };
        let own = keys.wake_list(&head);
        let lists: &[&str] = match parked_on {
            ParkedOn::Own => &[&own],
            ParkedOn::Heads => &[&fair.next],
            ParkedOn::Either => &[&own, &fair.next],
        };
        // A thread of this client parked now: woken in memory, and it looks
        // at once (no push, no announcement, no look of the hub's). One
        // not parked now (between two looks) gets its token as any other.
        // Its own list first (only it parks there), whatever the release
        // said: it may have parked there since.
        let on_heads_list = !matches!(parked_on, ParkedOn::Own);
        if self.backend.wake_parked(&own) || (on_heads_list && self.backend.wake_parked(&fair.next))
        {
            return;
        }
        for list in lists {
            let call = calls::push_baton(list, self.baton_ttl);
            let woken: Result<i64, Error> = self.backend.run(list, &keys.name, |c| call.invoke(c));
            if let Err(err) = woken {
                log::debug!(
                    "redbaton: waking the next waiter of fair lock {:?} failed: {err}",
                    keys.name
                );
            }
        }
    }

    /// Sends `call`, then, when `confirm` says its reply wrote an
    /// ownership and `replica_acks` is set, `WAIT`s on the same connection
    /// (WAIT counts the replicas that have every write of that
    /// connection). Returns the reply and, when too few replicas
    /// confirmed, how many did.
    fn call_confirmed<T: redis::FromRedisValue>(
        &self,
        at: At<'_>,
        call: &Call,
        confirm: impl Fn(&T) -> bool,
        mut undo: impl FnMut(&mut dyn redis::ConnectionLike) -> redis::RedisResult<()>,
    ) -> Result<Sent<(T, Option<u32>)>, Failed> {
        let Some(acks) = self.acks else {
            return self.call(at, call).map(|sent| Sent {
                value: (sent.value, None),
                resent: sent.resent,
            });
        };
        self.backend.exchange(at.key, at.name, |c| {
            let reply: T = call.invoke(c)?;
            if !confirm(&reply) {
                return Ok((reply, None));
            }
            let acknowledged = confirm::wait(c, acks)?;
            if acknowledged >= acks.replicas {
                return Ok((reply, None));
            }
            undo(c)?;
            Ok((reply, Some(acknowledged)))
        })
    }

    /// A renewal too few replicas confirmed still counts: the master has
    /// the longer lease, and failing the renewal would strand the lock
    /// there for that lease (its guard would give up on it). Until the
    /// replicas catch up, a failover may end the lease early: said loudly.
    fn warn_unconfirmed_renewals(&self, count: usize, acknowledged: u32) {
        let wanted = self.acks.map_or(0, |acks| acks.replicas);
        log::warn!(
            "redbaton: {count} lease renewal(s) on {} confirmed by {acknowledged} of the {wanted} \
             replicas replica_acks asks for; a failover now may end those leases early",
            self.backend.addr()
        );
    }

    fn not_replicated(&self, acknowledged: u32) -> Error {
        let acks = self.acks.unwrap_or(ReplicaAcks {
            replicas: 0,
            timeout: Duration::ZERO,
        });
        Error::NotReplicated {
            addr: self.backend.addr().to_owned(),
            wanted: acks.replicas,
            acknowledged,
            timeout: acks.timeout,
        }
    }
}

impl RawLock for DeploymentLock {
    fn attempt(&self, keys: &LockKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed> {
        // Only a fresh ownership is confirmed: a re-entry adds nothing a
        // promoted replica would need (the ownership itself was confirmed).
        let fresh = |reply: &AcquireReply| matches!(reply, AcquireReply::Acquired { depth: 1, .. });
        // A fair lock's undo names a waiter to wake, woken once the
        // connection is back in the pool.
        let mut woken = (None, ParkedOn::Either);
        let confirmed =
            self.call_confirmed(At::lock(keys), &calls::acquire(keys, args), fresh, |c| {
                // Made only when needed: an attempt is sent far more often
                // than undone.
                let undo = self.undo_call(keys, args.identity, args.request);
                if keys.fair.is_some() {
                    let undone: FairReply<Done> = undo.invoke(c)?;
                    woken = (undone.wake, undone.parked_on);
                    Ok(())
                } else {
                    undo.invoke::<Done>(c).map(drop)
                }
            });
        self.wake(keys, woken.0, woken.1);
        match confirmed?.value {
            (reply, None) => Ok(reply),
            (_, Some(acknowledged)) => Err(Failed {
                error: self.not_replicated(acknowledged),
                outcome_unknown: false,
            }),
        }
    }

    fn attempt_many(
        &self,
        names: &[ManyName<'_>],
        args: ManyArgs<'_>,
    ) -> Result<ManyReply, Failed> {
        let Some(first) = names.first() else {
            return Ok(ManyReply::Acquired(Vec::new()));
        };
        // As for one name: only fresh ownerships need the replicas, and
        // when they fall short every name this request took is undone on
        // the same connection.
        let fresh = |reply: &ManyReply| matches!(reply, ManyReply::Acquired(pairs) if pairs.iter().any(|&(_, depth)| depth == 1));
        let undo: Vec<Call> = names
            .iter()
            .map(|name| {
                calls::release_request(
                    name.keys,
                    args.identity,
                    args.request,
                    self.baton_ttl,
                    false,
                )
            })
            .collect();
        let confirmed = self.call_confirmed(
            At::lock(first.keys),
            &calls::acquire_many(names, args),
            fresh,
            |c| {
                for call in &undo {
                    call.invoke::<Done>(c)?;
                }
                Ok(())
            },
        );
        let count = names.len();
        let answered = match &confirmed {
            Ok(Sent {
                value: (ManyReply::Acquired(pairs), _),
                ..
            }) => pairs.len() == count,
            Ok(Sent {
                value: (ManyReply::Held { index, .. }, _),
                ..
            }) => *index < count,
            Err(_) => true,
        };
        if !answered {
            // Our bug, or someone else's script under our name: reported,
            // never read as a partial grant.
            let source = redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply",
                format!("lock/acquire_many.lua answered out of its {count} names"),
            ));
            return Err(Failed {
                error: Error::Redis { source },
                outcome_unknown: true,
            });
        }
        match confirmed?.value {
            (reply, None) => Ok(reply),
            (_, Some(acknowledged)) => Err(Failed {
                error: self.not_replicated(acknowledged),
                outcome_unknown: false,
            }),
        }
    }

    fn release(&self, release: ReleaseOne<'_>) -> Result<Sent<ReleaseReply>, Failed> {
        let ReleaseOne {
            keys,
            identity,
            fence,
            guards_left,
            lease,
            next_in_line,
            served,
        } = release;
        // The last release is confirmed like the acquisition was: one that
        // only this master has is lost if a replica is promoted, which then
        // keeps the ownership for its lease. An inner release only makes
        // the lease longer, as a renewal does.
        let Some(fair) = &keys.fair else {
            let call = calls::release(
                keys,
                identity,
                fence,
                guards_left,
                lease,
                self.baton_ttl,
                self.grants(),
            );
            let last = |reply: &ReleaseReply| matches!(reply, ReleaseReply::Released);
            return self.exchange_confirmed(keys, last, &call);
        };
        let call = calls::fair_release(
            keys,
            fair,
            identity,
            fence,
            guards_left,
            lease,
            self.baton_ttl,
            next_in_line,
            served,
            self.grants(),
        );
        // A release resent after a lost reply whose first run freed the
        // lock is told "not the owner", and names the head all the same
        // while the lock is free, so that it is woken at once. One the
        // replicas did not confirm wakes nobody: the head wakes at the end
        // of its park, after the release is sent again.
        let last = |reply: &FairReply<ReleaseReply>| matches!(reply.reply, ReleaseReply::Released);
        let sent = self.exchange_confirmed(keys, last, &call)?;
        self.wake(keys, sent.value.wake, sent.value.parked_on);
        Ok(Sent {
            value: sent.value.reply,
            resent: sent.resent,
        })
    }

    /// One pipeline, one round trip, for the whole batch. Under
    /// `replica_acks` (each last release confirmed on its own) and for fair
    /// locks (whose releases name a waiter to wake), one by one.
    fn release_many(&self, batch: &[ReleaseOne<'_>]) -> Vec<Result<Sent<ReleaseReply>, Failed>> {
        let one_by_one = batch.len() < 2
            || self.acks.is_some()
            || batch.iter().any(|release| release.keys.fair.is_some());
        if one_by_one {
            return batch.iter().map(|&r| self.release(r)).collect();
        }
        // One script for the batch (`lock/release_many.lua`): each name
        // released as `lock/release.lua` would, a refused name answered on
        // its own. Sent twice (after NOSCRIPT, or on a fresh connection),
        // it is safe: each release sets the depth it leaves, and a last
        // release sent again is told "not the owner" (`resent`).
        let args: Vec<_> = batch
            .iter()
            .map(|r| (r.keys, r.identity, r.fence, r.guards_left, r.lease))
            .collect();
        let call = calls::release_many(&args, self.baton_ttl);
        let first = batch[0].keys;
        let sent = self
            .backend
            .exchange(&first.lock, &first.name, |c| call.invoke::<Vec<Value>>(c));
        let count = batch.len();
        match sent {
            Ok(Sent { value, resent }) if value.len() == count => value
                .iter()
                .zip(batch)
                .map(|(value, release)| {
                    release_answer(value, &release.keys.name)
                        .map(|reply| Sent {
                            value: reply,
                            resent,
                        })
                        .map_err(|error| Failed {
                            error,
                            outcome_unknown: false,
                        })
                })
                .collect(),
            Ok(Sent { value, .. }) => {
                // Our bug, or someone else's script under our name:
                // reported for every name, never read as a release.
                let source = redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "unexpected reply",
                    format!(
                        "lock/release_many.lua answered {} of its {count} names",
                        value.len()
                    ),
                ));
                batch
                    .iter()
                    .map(|_| {
                        Err(Failed {
                            error: Error::Redis {
                                source: source.clone(),
                            },
                            outcome_unknown: true,
                        })
                    })
                    .collect()
            }
            Err(failed) => batch
                .iter()
                .map(|_| {
                    Err(Failed {
                        error: failed.error.clone(),
                        outcome_unknown: failed.outcome_unknown,
                    })
                })
                .collect(),
        }
    }

    fn release_again(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
        served: &[(String, u64)],
        _: &mut Answered,
    ) -> Result<(), Error> {
        // "Not the owner" is confirmed too: the earlier release may be on
        // this master only. Having written nothing, the connection's WAIT
        // then counts the replicas in sync with the master.
        let Some(fair) = &keys.fair else {
            let call = calls::release(
                keys,
                identity,
                fence,
                0,
                lease,
                self.baton_ttl,
                self.grants(),
            );
            let any = |_: &ReleaseReply| true;
            return self
                .exchange_confirmed(keys, any, &call)
                .map(drop)
                .map_err(|f| f.error);
        };
        let call = calls::fair_release(
            keys,
            fair,
            identity,
            fence,
            0,
            lease,
            self.baton_ttl,
            None,
            served,
            self.grants(),
        );
        let any = |_: &FairReply<ReleaseReply>| true;
        let sent = self
            .exchange_confirmed(keys, any, &call)
            .map_err(|f| f.error)?;
        self.wake(keys, sent.value.wake, sent.value.parked_on);
        Ok(())
    }

    fn hand_off(
        &self,
        keys: &LockKeys,
        args: HandoffArgs<'_>,
    ) -> Result<Sent<HandoffReply>, Failed> {
        let handed = |reply: &HandoffReply| reply.fence.is_some();
        let call = match &keys.fair {
            Some(fair) => calls::fair_handoff(keys, fair, args),
            None => calls::handoff(keys, args),
        };
        let sent = self.call_confirmed(At::lock(keys), &call, handed, |_| Ok(()))?;
        match sent.value {
            (reply, None) => Ok(Sent {
                value: reply,
                resent: sent.resent,
            }),
            // Reported as a hand-off of unknown outcome: the caller frees
            // the lock from both identities.
            (_, Some(acknowledged)) => Err(Failed {
                error: self.not_replicated(acknowledged),
                outcome_unknown: true,
            }),
        }
    }

    fn renew(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.renew_at(At::lock(keys), identity, fence, lease)
    }

    fn undo_request(
        &self,
        keys: &LockKeys,
        identity: &str,
        request: u64,
        _: &mut Answered,
    ) -> Result<(), Error> {
        let call = self.undo_call(keys, identity, request);
        // Confirmed under `replica_acks` (see `release_again`): an undo
        // only the master has is lost in a failover.
        if keys.fair.is_some() {
            let any = |_: &FairReply<Done>| true;
            let undone = self
                .exchange_confirmed(keys, any, &call)
                .map_err(|f| f.error)?;
            self.wake(keys, undone.value.wake, undone.value.parked_on);
        } else {
            let any = |_: &Done| true;
            self.exchange_confirmed(keys, any, &call)
                .map_err(|f| f.error)?;
        }
        Ok(())
    }

    fn holder(&self, keys: &LockKeys) -> Result<Option<Holder>, Error> {
        let call = calls::holder(keys);
        let HolderReply(row) = self
            .backend
            .run(&keys.lock, &keys.name, |c| call.invoke(c))?;
        Ok(row.map(Holder::from))
    }

    fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error> {
        self.backend.run(&keys.lock, &keys.name, |c| {
            // The field, not the key: a lock in its hand-over window
            // (`lib/hand_over.lua`) is a key without a holder.
            redis::cmd("HEXISTS").arg(&keys.lock).arg("flag").query(c)
        })
    }

    fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error> {
        let Some(fair) = &keys.fair else {
            let Done(removed) = self.run(keys, &calls::force_unlock(keys, self.baton_ttl))?;
            return Ok(removed);
        };
        let forced: FairReply<Done> = self.run(keys, &calls::fair_force_unlock(keys, fair))?;
        self.wake(keys, forced.wake, forced.parked_on);
        Ok(forced.reply.0)
    }

    fn queued(&self, keys: &LockKeys) -> Result<u64, Error> {
        let Some(fair) = &keys.fair else {
            return Ok(0);
        };
        // The server's clock, every place's end and the holder, in one
        // round trip: a place that ended is a dead waiter's that no script
        // purged yet, and the holder's is a grantee's, which stays in the
        // queue while it holds (see `fair/release.lua`).
        type Places = Vec<(String, f64)>;
        let (time, places, holder): ((u64, u64), Places, Option<String>) =
            self.backend.run(&keys.lock, &keys.name, |c| {
                redis::pipe()
                    .cmd("TIME")
                    .cmd("ZRANGE")
                    .arg(&fair.places)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .cmd("HGET")
                    .arg(&keys.lock)
                    .arg("flag")
                    .query(c)
            })?;
        let now_ms = time.0 * 1000 + time.1 / 1000;
        Ok(places
            .iter()
            .filter(|(waiter, end)| *end > now_ms as f64 && Some(waiter) != holder.as_ref())
            .count() as u64)
    }

    fn passes_in_memory(&self) -> bool {
        true
    }

    fn end_park(&self, keys: &LockKeys, list: &str) {
        if self.backend.wake_parked(list) {
            return;
        }
        let call = calls::push_baton(list, self.baton_ttl);
        let pushed: Result<i64, Error> = self.backend.run(list, &keys.name, |c| call.invoke(c));
        if let Err(err) = pushed {
            log::debug!(
                "redbaton: waking the waiter handed lock {:?} failed: {err}",
                keys.name
            );
        }
    }

    fn pass_baton(&self, keys: &LockKeys) {
        let call = calls::push_baton(&keys.baton, self.baton_ttl);
        let pushed: Result<i64, Error> = self
            .backend
            .run(&keys.baton, &keys.name, |c| call.invoke(c));
        if let Err(err) = pushed {
            log::debug!(
                "redbaton: passing the baton of {:?} on failed: {err}",
                keys.name
            );
        }
    }

    fn leave_queue(&self, keys: &LockKeys, identity: &str) -> Result<(), Error> {
        let Some(fair) = &keys.fair else {
            if self.grants.is_some() {
                self.run::<u8>(keys, &calls::withdraw(keys, identity))?;
            }
            return Ok(());
        };
        let left: FairReply<Done> = self.run(keys, &calls::leave_queue(keys, fair, identity))?;
        self.wake(keys, left.wake, left.parked_on);
        Ok(())
    }
}

impl RenewLeases for DeploymentLock {
    /// One pipeline per server for the whole round (one in all, except on
    /// a cluster). Renewal is idempotent, so sending it again (after
    /// `NOSCRIPT`, on a fresh connection after a dropped one, or to the
    /// slot's new master after a redirection) is safe.
    fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome> {
        renew_by_shard(&self.backend, requests, |batch| self.renew_shard(batch))
    }

    /// The key is gone, or holds another ownership (whatever it holds:
    /// renew.lua found it not this one's).
    fn why_lost(&self, request: &RenewRequest<'_>) -> LostReason {
        let exists = self.backend.run(request.key, request.name, |c| {
            redis::cmd("EXISTS").arg(request.key).query::<bool>(c)
        });
        match exists {
            Ok(true) => LostReason::TakenOver,
            Ok(false) => LostReason::Gone,
            Err(_) => LostReason::NotHeld,
        }
    }
}

impl DeploymentLock {
    /// Makes the ownership at `at` live at least `lease` more.
    fn renew_at(
        &self,
        at: At<'_>,
        identity: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        let call = calls::renew(at.key, identity, fence, lease);
        let renewed = |reply: &Done| reply.0;
        let sent = self
            .call_confirmed(at, &call, renewed, |_| Ok(()))
            .map_err(|failed| failed.error)?;
        let (Done(renewed), shortfall) = sent.value;
        if let Some(acknowledged) = shortfall {
            self.warn_unconfirmed_renewals(1, acknowledged);
        }
        Ok(renewed)
    }

    /// Renews `requests`, whose keys live on one server, in one pipeline
    /// (followed by `WAIT` under `replica_acks`).
    fn renew_shard(&self, requests: &[&RenewRequest<'_>]) -> Vec<RenewOutcome> {
        let calls: Vec<Call> = requests
            .iter()
            .map(|r| calls::renew(r.key, r.identity, r.fence, r.lease))
            .collect();
        let Some(first) = calls.first() else {
            return Vec::new();
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for call in &calls {
            call.add_to(&mut pipe);
        }
        if let Some(acks) = self.acks {
            pipe.add_command(wait_command(acks));
        }
        let key = requests[0].key;
        let replies = self.backend.run(key, "(watchdog renewal)", |c| {
            if !self.renew_loaded.load(Ordering::Relaxed) {
                first.load(c)?;
                self.renew_loaded.store(true, Ordering::Relaxed);
            }
            let values: Vec<Value> = pipe.query(c)?;
            if !forgot_script(&values) {
                return Ok(values);
            }
            first.load(c)?;
            pipe.query(c)
        });
        let mut values = match replies {
            Ok(values) => values,
            Err(err) => {
                log::warn!("redbaton: watchdog renewal failed: {err}");
                return vec![RenewOutcome::Retry; requests.len()];
            }
        };
        if let Some(acks) = self.acks {
            let acknowledged = values
                .pop()
                .and_then(|v| redis::from_redis_value::<u32>(v).ok())
                .unwrap_or(0);
            if acknowledged < acks.replicas {
                self.warn_unconfirmed_renewals(requests.len(), acknowledged);
            }
        }
        let mut outcomes: Vec<RenewOutcome> = values.iter().map(renew_outcome).collect();
        for (i, value) in values.iter().enumerate() {
            if is_redirection(value) {
                // The slot moved, or is moving: renew this one alone,
                // which follows the redirection (and reloads the map for
                // a `MOVED`, not for an `ASK`).
                let r = requests[i];
                let at = At {
                    key: r.key,
                    name: r.name,
                };
                outcomes[i] = match self.renew_at(at, r.identity, r.fence, r.lease) {
                    Ok(true) => RenewOutcome::Renewed,
                    Ok(false) => RenewOutcome::Lost,
                    Err(_) => RenewOutcome::Retry,
                };
            }
        }
        outcomes
    }
}

/// The key an exchange works on (which routes it) and the object's name
/// (for messages).
#[derive(Debug, Clone, Copy)]
struct At<'a> {
    key: &'a str,
    name: &'a str,
}

impl<'a> At<'a> {
    /// The lock key of `keys`.
    fn lock(keys: &'a LockKeys) -> Self {
        At {
            key: &keys.lock,
            name: &keys.name,
        }
    }
}

/// Whether a pipeline's replies say the server does not have the script
/// (after a restart or `SCRIPT FLUSH`): load it and send the pipeline again.
fn forgot_script(values: &[Value]) -> bool {
    values.iter().any(|value| {
        matches!(value, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript))
    })
}

/// `WAIT replicas timeout`: how many replicas have every write this
/// connection made, once that many do or the timeout passes.
fn wait_command(acks: ReplicaAcks) -> redis::Cmd {
    let mut wait = redis::cmd("WAIT");
    wait.arg(acks.replicas)
        .arg(crate::scripts::millis(acks.timeout));
    wait
}

/// One name's answer in `lock/release_many.lua`'s reply: release.lua's
/// number, or the message of the error that left the lock `name` as it
/// was, told as one lock's release tells it (a `WRONGTYPE` is
/// [`Error::WrongType`]).
pub(super) fn release_answer(value: &Value, name: &str) -> Result<ReleaseReply, Error> {
    let refused = |message: String| match message.strip_prefix("WRONGTYPE ") {
        Some(detail) => Error::WrongType {
            name: name.to_owned(),
            detail: detail.to_owned(),
        },
        None => Error::Redis {
            source: RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "a release was refused",
                message,
            )),
        },
    };
    match value {
        Value::BulkString(bytes) => Err(refused(String::from_utf8_lossy(bytes).into_owned())),
        Value::SimpleString(text) => Err(refused(text.clone())),
        other => ReleaseReply::from_redis_value(other.clone()).map_err(|err| Error::Redis {
            source: RedisError::from(err),
        }),
    }
}

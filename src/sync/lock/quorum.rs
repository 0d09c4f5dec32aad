//! Redlock: the lock held by a majority of independent masters, as a
//! [`RawLock`] over one single-server backend per master, speaking the same
//! scripts as on one server, so that the handle, the guard, the wait loop
//! and the watchdog are the same too.
//!
//! Every exchange goes to all masters at once (`Backend::send_to`): a
//! round costs the slowest answering master's round trip, or one node
//! timeout (a share of the lease the round is about), never one per master
//! that does not answer; a master that fails or is late counts as "not
//! there" and never aborts the round, and is left out of later rounds
//! until it answers again. An acquisition counts only with a majority **and**
//! validity left (`lease − elapsed − drift`); otherwise whatever it took is
//! undone on every master. Fencing tokens are agreed in a second round: the
//! highest token of the granting majority + 1, accepted by a majority of
//! counters (`scripts/lock/adopt_fence.lua`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind, Value};

use super::raw::{release_answer, Answered, Holder, Owner, RawLock, ReleaseOne};
use crate::backend::{Backend, Failed, Sent};
use crate::config::{ClockDrift, Config, NodeTimeout};
use crate::error::Error;
use crate::keys::LockKeys;
use crate::lease::{RenewLeases, RenewOutcome, RenewRequest};
use crate::scripts::lock::{self as calls, AcquireArgs, HandoffArgs, ManyArgs, ManyName};
use crate::scripts::reply::{
    AcquireReply, Done, HandoffReply, HolderReply, Line, ManyReply, ReleaseReply,
};
use crate::scripts::Call;

/// The Redlock lock protocol over several masters.
#[derive(Debug)]
pub(crate) struct QuorumLock {
    /// The quorum: every round goes through it.
    quorum: Arc<Backend>,
    /// Its single-server backends, one per master, in the order of a
    /// round's results.
    masters: Vec<Arc<Backend>>,
    baton_ttl: Duration,
    /// For messages: every master's address.
    addrs: String,
    /// How long fencing counters stay: they must outlive every holder.
    fence_ttl: Duration,
    /// The allowance for the masters' clocks and this one disagreeing.
    drift: ClockDrift,
    /// How long a round waits for each master, by lease.
    node_timeout: NodeTimeout,
    /// The lease of rounds about no particular ownership (`holder`).
    default_lease: Duration,
}

impl QuorumLock {
    /// The protocol over `quorum`, a backend of independent masters.
    pub(crate) fn new(quorum: &Arc<Backend>, config: &Config) -> Self {
        QuorumLock {
            masters: quorum.masters().unwrap_or_default().to_vec(),
            addrs: quorum.addr().to_owned(),
            quorum: Arc::clone(quorum),
            baton_ttl: config.baton_ttl,
            fence_ttl: config.fence_ttl,
            drift: config.clock_drift,
            node_timeout: config.node_timeout,
            default_lease: config.default_lease,
        }
    }

    /// The majority.
    fn quorum(&self) -> usize {
        quorum(self.masters.len())
    }

    /// Sends `call`, about an ownership of `lease`, to every master at
    /// once and reads every reply. A master that does not have the script
    /// yet gets it loaded and the call sent again, alone (it did not run
    /// there).
    fn round<T: FromRedisValue>(
        &self,
        key: &str,
        name: &str,
        call: &Call,
        lease: Duration,
    ) -> Vec<Result<T, Error>> {
        self.round_reporting(key, name, call, lease)
            .into_iter()
            .map(|reply| reply.map_err(|failed| failed.error))
            .collect()
    }

    /// [`QuorumLock::round`], telling for each failed master whether the
    /// call may have run there.
    fn round_reporting<T: FromRedisValue>(
        &self,
        key: &str,
        name: &str,
        call: &Call,
        lease: Duration,
    ) -> Vec<Result<T, Failed>> {
        self.round_to(key, name, call, lease, None)
    }

    /// [`QuorumLock::round_reporting`], to the masters `only` marks (all:
    /// `None`).
    fn round_to<T: FromRedisValue>(
        &self,
        key: &str,
        name: &str,
        call: &Call,
        lease: Duration,
        only: Option<&[bool]>,
    ) -> Vec<Result<T, Failed>> {
        let timeout = self.node_timeout.for_lease(lease);
        self.quorum
            .send_to(name, &call.packed(), timeout, only)
            .into_iter()
            .zip(&self.masters)
            .map(|(reply, server)| match reply {
                Ok(value) => T::from_redis_value(value).map_err(|err| Failed {
                    error: Error::Redis {
                        source: RedisError::from(err),
                    },
                    outcome_unknown: false,
                }),
                // Not run there: load it, then send it again (once).
                Err(failed) if is_noscript(&failed.error) => server
                    .exchange(key, name, |c| {
                        call.load(c)?;
                        call.invoke(c)
                    })
                    .map(|sent| sent.value),
                Err(failed) => Err(failed),
            })
            .collect()
    }

    /// Why a round reached no majority, `answered` masters having answered
    /// and the others failed with `errors`. When a majority gave one
    /// definite answer (say `WRONGTYPE`: the key holds something else
    /// there), that is the error: no retry or other master would change it.
    /// Otherwise [`Error::NoQuorum`].
    fn no_quorum(&self, answered: usize, errors: &[&Error]) -> Error {
        let definite: Vec<&&Error> = errors
            .iter()
            .filter(|err| !err.is_transient() && !err.is_timeout())
            .collect();
        if definite.len() >= self.quorum() {
            return (*definite[0]).clone();
        }
        Error::NoQuorum {
            addr: self.addrs.clone(),
            answered,
            needed: self.quorum(),
            masters: self.masters.len(),
            detail: errors
                .first()
                .map_or_else(|| "no error reported".to_owned(), |err| err.to_string()),
        }
    }

    /// The fencing token of the ownership `identity` was just granted by
    /// the masters whose own tokens are `granted`, in a round started at
    /// `started` for `lease`: above all of them, and accepted by a majority
    /// of counters (so no later majority can issue it or a lower one)
    /// while the validity lasts. The error says why not.
    fn agree_on_token(
        &self,
        keys: &LockKeys,
        identity: &str,
        granted: &[u64],
        lease: Duration,
        started: Instant,
    ) -> Result<u64, Error> {
        let token = proposed_token(granted).unwrap_or(u64::MAX);
        let adopt = calls::adopt_fence(keys, identity, token, self.fence_ttl);
        let accepted = self
            .round::<Done>(&keys.lock, &keys.name, &adopt, lease)
            .into_iter()
            .filter(|r| matches!(r, Ok(Done(true))))
            .count();
        if accepted >= self.quorum() && validity(lease, started.elapsed(), self.drift).is_some() {
            return Ok(token);
        }
        let refused = Error::Unavailable {
            addr: self.addrs.clone(),
            detail: format!(
                "{accepted} masters accepted the quorum's fencing token {token} (another \
                 proposal raced it, or the round ran out of validity)"
            ),
        };
        Err(self.no_quorum(accepted, &[&refused]))
    }

    /// Undoes request `request` of `identity` (for a lease of `lease`) on
    /// every master. `lost_round`: the request never had the lock (a round
    /// without a majority), so a master wakes a waiter only if one found
    /// the grant there in its way. Waking every waiter parked there instead
    /// sends them into the same lost round while the winner holds the other
    /// masters, and their undos wake them again: a storm of rounds for as
    /// long as the winner holds the lock. The losers park where they found
    /// the winner's hold instead (`prefer_parking`): its release wakes them
    /// there. `may_hold`: per master, whether the request may have taken
    /// the lock there; the first failure to undo it on one of those is
    /// returned, for the caller to undo it again in the background.
    fn undo_everywhere(
        &self,
        keys: &LockKeys,
        identity: &str,
        request: u64,
        lease: Duration,
        lost_round: bool,
        may_hold: &[bool],
    ) -> Option<Error> {
        let call = calls::release_request(keys, identity, request, self.baton_ttl, lost_round);
        let replies = self.round::<Done>(&keys.lock, &keys.name, &call, lease);
        // A master the request may have reached and the undo did not keeps
        // that hold for its lease: the caller undoes it again later, or the
        // waiters parked there sleep until it expires.
        let mut unfinished = None;
        for (result, may_hold) in replies.into_iter().zip(may_hold) {
            if let Err(err) = result {
                log::debug!("redbaton: undo on a master failed: {err}");
                if *may_hold && unfinished.is_none() {
                    unfinished = Some(err);
                }
            }
        }
        unfinished
    }

    /// [`QuorumLock::undo_everywhere`] for every name of a set that request
    /// `request` of `identity` may have taken: one round per name (an
    /// undo is per name's keys, and a round carries one call per master).
    /// Names the request only re-entered keep their own request number,
    /// so their undo changes nothing. Returns the first failure to undo a
    /// name on a master where it may stand.
    fn undo_set(
        &self,
        names: &[ManyName<'_>],
        identity: &str,
        request: u64,
        lost_round: bool,
        may_hold: &[bool],
    ) -> Option<Error> {
        let mut unfinished = None;
        for name in names {
            let failed = self.undo_everywhere(
                name.keys, identity, request, name.lease, lost_round, may_hold,
            );
            if unfinished.is_none() {
                unfinished = failed;
            }
        }
        unfinished
    }

    /// Sends `call` (a release or an undo, safe to repeat) to the masters
    /// that have not answered it yet and are not suspect: done once every
    /// master answered. A master that keeps failing costs nothing while it
    /// is suspect (its probe decides when it is tried again), and masters
    /// that answered are not sent it again.
    fn finish<T: FromRedisValue>(
        &self,
        keys: &LockKeys,
        call: &Call,
        lease: Duration,
        answered: &mut Answered,
    ) -> Result<(), Error> {
        let answered = &mut answered.0;
        if answered.len() != self.masters.len() {
            *answered = vec![false; self.masters.len()];
        }
        let due: Vec<bool> = (0..self.masters.len())
            .map(|index| !answered[index] && !self.quorum.is_suspect(index))
            .collect();
        if due.contains(&true) {
            let replies = self.round_to::<T>(&keys.lock, &keys.name, call, lease, Some(&due));
            for (index, reply) in replies.into_iter().enumerate() {
                match reply {
                    _ if !due[index] => {}
                    Ok(_) => answered[index] = true,
                    // A definite refusal (the key holds something else
                    // there): sending it again changes nothing.
                    Err(failed) if !failed.error.is_transient() && !failed.error.is_timeout() => {
                        return Err(failed.error)
                    }
                    Err(_) => {}
                }
            }
        }
        match answered.iter().position(|done| !done) {
            None => Ok(()),
            Some(index) => Err(Error::Unavailable {
                addr: self.masters[index].addr().to_owned(),
                detail: "has not answered yet; sent again once it does".to_owned(),
            }),
        }
    }

    /// What one lock's release round (`replies`, one per master) comes
    /// to: released (in part, when masters did not answer) or inner on a
    /// majority, not the owner anywhere, or failed (sent again later).
    fn released(
        &self,
        keys: &LockKeys,
        replies: &[Result<ReleaseReply, Error>],
    ) -> Result<Sent<ReleaseReply>, Failed> {
        let mut had = 0;
        // Every master was sent the release once.
        let resent = false;
        let mut depth = None;
        let mut errors = Vec::new();
        for reply in replies {
            match reply {
                Ok(ReleaseReply::Released | ReleaseReply::ReleasedInPart) => had += 1,
                Ok(ReleaseReply::Inner { depth: d }) => {
                    had += 1;
                    depth = Some(*d);
                }
                Ok(ReleaseReply::NotOwner) => {}
                Err(err) => errors.push(err),
            }
        }
        if had >= self.quorum() || (errors.is_empty() && had > 0) {
            let value = match depth {
                Some(depth) => ReleaseReply::Inner { depth },
                // A master that did not answer may still hold its copy
                // (its part of the acquisition may have run with the reply
                // lost), and waiters that found the lock held there park
                // there: only a release there wakes them before the copy
                // expires.
                None if !errors.is_empty() => ReleaseReply::ReleasedInPart,
                None => ReleaseReply::Released,
            };
            if had < self.quorum() {
                log::warn!(
                    "redbaton: lock {:?} was released on {had} of {} masters only; it was no \
                     longer held by a majority",
                    keys.name,
                    self.masters.len()
                );
            }
            return Ok(Sent { value, resent });
        }
        if errors.is_empty() {
            return Ok(Sent {
                value: ReleaseReply::NotOwner,
                resent,
            });
        }
        // Some masters did not answer: the caller sends it again later (the
        // keys there expire with the lease otherwise).
        Err(Failed {
            error: self.no_quorum(replies.len() - errors.len(), &errors),
            outcome_unknown: true,
        })
    }

    /// Makes the ownership of `identity` under `fence` at `key` (of the
    /// lock `name`) live at least `lease` more on a majority, within the
    /// validity of the round.
    fn renew_at(
        &self,
        key: &str,
        name: &str,
        identity: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        let started = Instant::now();
        let call = calls::renew(key, identity, fence, lease);
        let replies = self.round::<Done>(key, name, &call, lease);
        let renewed = replies
            .iter()
            .filter(|r| matches!(r, Ok(Done(true))))
            .count();
        if renewed >= self.quorum() && validity(lease, started.elapsed(), self.drift).is_some() {
            return Ok(true);
        }
        let errors: Vec<&Error> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
        if renewed + errors.len() >= self.quorum() && !errors.is_empty() {
            // A majority may still hold it: not known lost, try again.
            return Err(self.no_quorum(replies.len() - errors.len(), &errors));
        }
        Ok(false)
    }
}

/// The majority of `masters`.
pub(crate) fn quorum(masters: usize) -> usize {
    masters / 2 + 1
}

/// What is left of `lease` after `elapsed` and the clock drift allowed for
/// it; `None` when nothing is.
pub(crate) fn validity(lease: Duration, elapsed: Duration, drift: ClockDrift) -> Option<Duration> {
    let drift = drift.allowance(lease);
    lease
        .checked_sub(elapsed)
        .and_then(|left| left.checked_sub(drift))
        .filter(|left| !left.is_zero())
}

/// How far ahead of this process's clock a proposed token is: enough to be
/// above every master's clock (tokens are at least the server's clock in
/// µs) when clocks disagree by less than this, so that the masters take
/// the proposal as it is.
const PROPOSAL_LEAD: Duration = Duration::from_secs(1);

/// The token a fresh quorum acquisition proposes: this process's clock in
/// µs plus [`PROPOSAL_LEAD`]. Each master issues at least it (and above its
/// own counter), so masters whose clocks and counters are behind the
/// proposal all answer exactly it, and [`one_token`] spares the second
/// round. 0 (no proposal) if the clock reads before 1970.
fn first_proposal() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| {
            u64::try_from((now + PROPOSAL_LEAD).as_micros()).unwrap_or(0)
        })
}

/// The quorum's token without a second round, when every granting master
/// (a majority) issued the same one: each issued it above its own counter
/// and now holds it there, which is what the second round
/// (`adopt_fence.lua`) would establish. A master never issues a token
/// twice, so no other majority can get this one, and any later majority
/// meets this one in a master whose counter is at least it. `None` when
/// the masters' tokens differ (a counter or clock ahead of the proposal):
/// the second round then agrees on the highest + 1.
pub(crate) fn one_token(granted: &[u64]) -> Option<u64> {
    let first = *granted.first()?;
    granted.iter().all(|token| *token == first).then_some(first)
}

/// The quorum's token from the granting masters' own tokens: above all of
/// them.
pub(crate) fn proposed_token(granted: &[u64]) -> Option<u64> {
    granted.iter().max()?.checked_add(1)
}

impl RawLock for QuorumLock {
    fn attempt(&self, keys: &LockKeys, args: AcquireArgs<'_>) -> Result<AcquireReply, Failed> {
        // A lease the drift allowance eats whole could never be valid.
        if validity(args.lease, Duration::ZERO, self.drift).is_none() {
            return Err(Failed {
                error: Error::InvalidLease { lease: args.lease },
                outcome_unknown: false,
            });
        }
        let fresh = args.held_fence == 0;
        let proposal = if fresh { first_proposal() } else { 0 };
        // Nothing passes in memory on a quorum: no tokens set aside; and
        // its waiters' parks end by a look (`Quorum::park`), which pops.
        // They are not kept out of a hand-over window's first part (they
        // park through a window as through a hold), so they have no token
        // to put back for its waiter (`AcquireArgs::after_park`).
        let args = AcquireArgs {
            proposed_token: proposal,
            reserve: 0,
            takes_token: false,
            after_park: false,
            on_heads_list: false,
            ..args
        };
        let started = Instant::now();
        let replies = self.round_reporting::<AcquireReply>(
            &keys.lock,
            &keys.name,
            &calls::acquire(keys, args),
            args.lease,
        );
        let elapsed = started.elapsed();
        let mut granted = Vec::new();
        let mut held = Vec::new();
        let mut errors = Vec::new();
        let mut maybe_ran = false;
        // Per master: whether this round may have taken the lock there.
        let mut may_hold = vec![false; replies.len()];
        // Where a waiter parks next: a master that found the lock held. This
        // round marked the lock there (`waited`), so its release or undo
        // pushes a baton there; a master where this round was granted may
        // get none: the holder may never have had it. Not a master whose
        // hold ends before the majority's: that is a copy left behind (by a
        // hand-off or an undo that did not reach it), which the holder's
        // release does not clear, so no baton comes from there.
        let mut held_at = Vec::new();
        for (index, reply) in replies.iter().enumerate() {
            match reply {
                Ok(AcquireReply::Acquired { fence, .. }) => {
                    may_hold[index] = true;
                    granted.push(*fence);
                }
                Ok(AcquireReply::Held { lease_left, .. }) => {
                    let lease_left = lease_left.unwrap_or(Duration::MAX);
                    held_at.push((index, lease_left));
                    held.push(lease_left);
                }
                Err(failed) => {
                    maybe_ran |= failed.outcome_unknown;
                    may_hold[index] = failed.outcome_unknown;
                    errors.push(&failed.error);
                }
            }
        }
        self.quorum
            .prefer_parking(parking_master(&held_at, self.quorum()));
        let valid = validity(args.lease, elapsed, self.drift).is_some();
        if granted.len() >= self.quorum() && valid {
            if !fresh {
                return Ok(AcquireReply::Acquired {
                    fence: args.held_fence,
                    depth: args.depth as u64,
                    next_in_line: None,
                    line: Line::default(),
                });
            }
            if let Some(token) = one_token(&granted) {
                return Ok(AcquireReply::Acquired {
                    fence: token,
                    depth: 1,
                    next_in_line: None,
                    line: Line::default(),
                });
            }
            match self.agree_on_token(keys, args.identity, &granted, args.lease, started) {
                Ok(token) => {
                    return Ok(AcquireReply::Acquired {
                        fence: token,
                        depth: 1,
                        next_in_line: None,
                        line: Line::default(),
                    })
                }
                Err(error) => {
                    // A majority granted it: waiters may have parked behind
                    // it, and are owed a wake-up.
                    let unfinished = self.undo_everywhere(
                        keys,
                        args.identity,
                        args.request,
                        args.lease,
                        false,
                        &may_hold,
                    );
                    return Err(Failed {
                        error,
                        outcome_unknown: unfinished.is_some(),
                    });
                }
            }
        }
        // Not acquired: free whatever this round took, on every master
        // (also those that failed: the script may have run there). A
        // majority that ran out of validity was the lock for a while;
        // anything less never was.
        if fresh && (!granted.is_empty() || maybe_ran) {
            let lost_round = granted.len() < self.quorum();
            let unfinished = self.undo_everywhere(
                keys,
                args.identity,
                args.request,
                args.lease,
                lost_round,
                &may_hold,
            );
            if let Some(error) = unfinished {
                // A hold of this request may stand on a master the undo did
                // not reach: reported as unknown, so that the caller undoes
                // it in the background as soon as that master answers, not
                // at the end of its lease (waiters that park there would
                // hear nothing until then).
                return Err(Failed {
                    error,
                    outcome_unknown: true,
                });
            }
        }
        if held.len() >= self.quorum() || (errors.is_empty() && granted.is_empty()) {
            // Held by someone else: wait for the shortest lease seen on a
            // majority.
            // No expiry counts as the longest.
            let mut leases = held;
            leases.sort();
            let lease_left = leases
                .get(self.quorum() - 1)
                .copied()
                .filter(|l| *l != Duration::MAX);
            // A window refused on some masters is waited out as a hold
            // (a quorum's waiters park; see `lib/hand_over.lua`).
            return Ok(AcquireReply::Held {
                lease_left,
                arrival: 0,
                handing_over: false,
                heads_list: false,
            });
        }
        if granted.len() + errors.len() < self.quorum() || errors.is_empty() {
            // Contenders split the masters: look again after a short random
            // delay, so that one of them wins the next round.
            return Ok(AcquireReply::Held {
                lease_left: Some(tie_break_delay()),
                arrival: 0,
                handing_over: false,
                heads_list: false,
            });
        }
        Err(Failed {
            error: self.no_quorum(replies.len() - errors.len(), &errors),
            outcome_unknown: false,
        })
    }

    /// One Redlock round for a whole set: every master is sent one
    /// `lock/acquire_many.lua` over every name (all or none on that
    /// master), and the set counts only when a majority of masters took
    /// every name **and** every name's lease has validity left, as for one
    /// lock. Fresh names carry one proposed token ([`first_proposal`]):
    /// a name whose granting masters all issued the same token has it
    /// without a second round ([`one_token`]); only a name whose tokens
    /// differ gets the second round of [`QuorumLock::agree_on_token`]. A
    /// re-entered name keeps its held token. Anything less is undone on
    /// every master, name by name (`release_request.lua`), as a lost
    /// single-name round is.
    ///
    /// The name reported held is the one the most masters found in their
    /// way (a master reports only the first held name in the set's order),
    /// the first in the set's order among equals; its lease left is the
    /// one a single lock's round computes from those masters' answers, and
    /// the waiter parks on one of those masters (each marked that name
    /// `waited`, so its release pushes a baton there).
    fn attempt_many(
        &self,
        names: &[ManyName<'_>],
        args: ManyArgs<'_>,
    ) -> Result<ManyReply, Failed> {
        let Some(first) = names.first() else {
            return Ok(ManyReply::Acquired(Vec::new()));
        };
        // A lease the drift allowance eats whole could never be valid.
        if let Some(name) = names
            .iter()
            .find(|name| validity(name.lease, Duration::ZERO, self.drift).is_none())
        {
            return Err(Failed {
                error: Error::InvalidLease { lease: name.lease },
                outcome_unknown: false,
            });
        }
        // The round waits for each master as long as the set's shortest
        // lease allows.
        let shortest = names
            .iter()
            .map(|name| name.lease)
            .min()
            .unwrap_or(first.lease);
        let valid_after = |elapsed: Duration| {
            names
                .iter()
                .all(|name| validity(name.lease, elapsed, self.drift).is_some())
        };
        let fresh = names.iter().any(|name| name.held_fence == 0);
        let proposal = if fresh { first_proposal() } else { 0 };
        let args = ManyArgs {
            proposed_token: proposal,
            reserve: 0,
            ..args
        };
        let started = Instant::now();
        let replies = self.round_reporting::<ManyReply>(
            &first.keys.lock,
            &first.keys.name,
            &calls::acquire_many(names, args),
            shortest,
        );
        let elapsed = started.elapsed();
        let count = names.len();
        let quorum = self.quorum();
        // Per granting master, (fence, depth) per name.
        let mut granted: Vec<Vec<(u64, u64)>> = Vec::new();
        // Per name, the masters that found it first in the way, with the
        // lease they saw left.
        let mut held: Vec<Vec<(usize, Duration)>> = vec![Vec::new(); count];
        let mut errors: Vec<Error> = Vec::new();
        let mut maybe_ran = false;
        let mut may_hold = vec![false; replies.len()];
        for (master, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(ManyReply::Acquired(pairs)) if pairs.len() == count => {
                    may_hold[master] = true;
                    granted.push(pairs);
                }
                Ok(ManyReply::Held {
                    index, lease_left, ..
                }) if index < count => {
                    held[index].push((master, lease_left.unwrap_or(Duration::MAX)));
                }
                Ok(_) => {
                    // Our bug, or someone else's script under our name:
                    // never read as a partial grant, and undone in case it
                    // took something.
                    maybe_ran = true;
                    may_hold[master] = true;
                    errors.push(Error::Redis {
                        source: RedisError::from((
                            ErrorKind::Parse,
                            "unexpected reply",
                            format!("lock/acquire_many.lua answered out of its {count} names"),
                        )),
                    });
                }
                Err(failed) => {
                    maybe_ran |= failed.outcome_unknown;
                    may_hold[master] = failed.outcome_unknown;
                    errors.push(failed.error);
                }
            }
        }
        let in_way = (0..count)
            .filter(|&index| !held[index].is_empty())
            .max_by_key(|&index| (held[index].len(), std::cmp::Reverse(index)));
        // Where a waiter parks next: as for one lock, a master that found
        // the name in the way held (and marked it `waited` there), not a
        // copy left behind.
        self.quorum
            .prefer_parking(in_way.and_then(|index| parking_master(&held[index], quorum)));
        if granted.len() >= quorum && valid_after(elapsed) {
            let mut pairs = Vec::with_capacity(count);
            let mut agreed = false;
            for (index, name) in names.iter().enumerate() {
                if name.held_fence != 0 {
                    pairs.push((name.held_fence, name.depth as u64));
                    continue;
                }
                let tokens: Vec<u64> = granted.iter().map(|pairs| pairs[index].0).collect();
                if let Some(token) = one_token(&tokens) {
                    pairs.push((token, 1));
                    continue;
                }
                agreed = true;
                let agreement =
                    self.agree_on_token(name.keys, args.identity, &tokens, name.lease, started);
                match agreement {
                    // Each agreement checks its own name's validity; the
                    // last one checked below covers the set's.
                    Ok(token) => pairs.push((token, 1)),
                    Err(error) => {
                        // A majority granted the set: waiters may have
                        // parked behind it, and are owed a wake-up.
                        let unfinished =
                            self.undo_set(names, args.identity, args.request, false, &may_hold);
                        return Err(Failed {
                            error,
                            outcome_unknown: unfinished.is_some(),
                        });
                    }
                }
            }
            if !agreed || valid_after(started.elapsed()) {
                return Ok(ManyReply::Acquired(pairs));
            }
            let unfinished = self.undo_set(names, args.identity, args.request, false, &may_hold);
            let refused = Error::Unavailable {
                addr: self.addrs.clone(),
                detail: "the set's second rounds (agreeing on its fencing tokens) ran out of \
                         validity"
                    .to_owned(),
            };
            return Err(Failed {
                error: self.no_quorum(granted.len(), &[&refused]),
                outcome_unknown: unfinished.is_some(),
            });
        }
        // Not acquired: free whatever this round took, on every master
        // (also those that failed: the script may have run there). Unlike
        // one lock's round, a set of re-entries only is undone too: a
        // master that lacked a re-entered name took it afresh under this
        // request, and the undo frees exactly that (a re-entered copy
        // keeps its own request number).
        if !granted.is_empty() || maybe_ran {
            let lost_round = granted.len() < quorum;
            let unfinished =
                self.undo_set(names, args.identity, args.request, lost_round, &may_hold);
            if let Some(error) = unfinished {
                // As for one lock: undone in the background once that
                // master answers.
                return Err(Failed {
                    error,
                    outcome_unknown: true,
                });
            }
        }
        if let Some(index) = in_way {
            if held[index].len() >= quorum || (errors.is_empty() && granted.is_empty()) {
                // Held by someone else: wait for the shortest lease seen on
                // a majority (no expiry counts as the longest).
                let mut leases: Vec<Duration> = held[index].iter().map(|(_, l)| *l).collect();
                leases.sort();
                let lease_left = leases
                    .get(quorum - 1)
                    .copied()
                    .filter(|l| *l != Duration::MAX);
                return Ok(ManyReply::Held {
                    index,
                    lease_left,
                    handing_over: false,
                });
            }
        }
        if granted.len() + errors.len() < quorum || errors.is_empty() {
            // Contenders split the masters: look again after a short random
            // delay, so that one of them wins the next round.
            return Ok(ManyReply::Held {
                index: in_way.unwrap_or(0),
                lease_left: Some(tie_break_delay()),
                handing_over: false,
            });
        }
        let errors: Vec<&Error> = errors.iter().collect();
        Err(Failed {
            error: self.no_quorum(may_hold.len() - errors.len(), &errors),
            outcome_unknown: false,
        })
    }

    fn release(&self, release: ReleaseOne<'_>) -> Result<Sent<ReleaseReply>, Failed> {
        let ReleaseOne {
            keys,
            identity,
            fence,
            guards_left,
            lease,
            ..
        } = release;
        let call = calls::release(
            keys,
            identity,
            fence,
            guards_left,
            lease,
            self.baton_ttl,
            None,
        );
        let replies = self.round::<ReleaseReply>(&keys.lock, &keys.name, &call, lease);
        self.released(keys, &replies)
    }

    /// One round for a set's releases: every master is sent one
    /// `lock/release_many.lua` that releases each name there as
    /// `lock/release.lua` would, and each name's answers are read as one
    /// lock's release reads its round. Safe to send again, as each
    /// release is (it sets the depth it leaves; a last release sent again
    /// is told "not the owner").
    fn release_many(&self, batch: &[ReleaseOne<'_>]) -> Vec<Result<Sent<ReleaseReply>, Failed>> {
        let [first, _, ..] = batch else {
            return batch.iter().map(|&r| self.release(r)).collect();
        };
        let args: Vec<_> = batch
            .iter()
            .map(|r| (r.keys, r.identity, r.fence, r.guards_left, r.lease))
            .collect();
        let call = calls::release_many(&args, self.baton_ttl);
        // The round waits for each master as long as the shortest lease
        // of the set allows.
        let lease = batch.iter().map(|r| r.lease).min().unwrap_or(first.lease);
        let replies = self.round::<Vec<Value>>(&first.keys.lock, &first.keys.name, &call, lease);
        batch
            .iter()
            .enumerate()
            .map(|(index, release)| {
                let answers: Vec<Result<ReleaseReply, Error>> = replies
                    .iter()
                    .map(|reply| match reply {
                        Ok(values) if values.len() == batch.len() => {
                            release_answer(&values[index], &release.keys.name)
                        }
                        Ok(values) => Err(Error::Redis {
                            source: RedisError::from((
                                ErrorKind::Parse,
                                "unexpected reply",
                                format!(
                                    "lock/release_many.lua answered {} of its {} names",
                                    values.len(),
                                    batch.len()
                                ),
                            )),
                        }),
                        Err(err) => Err(err.clone()),
                    })
                    .collect();
                self.released(release.keys, &answers)
            })
            .collect()
    }

    /// Done once every master answered it (released, or not the owner
    /// there any more), each sent it until it does: a suspect master only
    /// once its probe finds it answering.
    fn release_again(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
        _: &[(String, u64)],
        answered: &mut Answered,
    ) -> Result<(), Error> {
        let call = calls::release(keys, identity, fence, 0, lease, self.baton_ttl, None);
        self.finish::<ReleaseReply>(keys, &call, lease, answered)
    }

    /// Passes the lock to a local waiter on every master at once. Like an
    /// acquisition, it counts only when a majority handed it over with
    /// validity left and a majority of counters accepted the new
    /// ownership's token. Anything less is reported as a hand-off of
    /// unknown outcome: the guard then frees the lock from both identities
    /// wherever it is, and the waiter looks at the lock itself.
    fn hand_off(
        &self,
        keys: &LockKeys,
        args: HandoffArgs<'_>,
    ) -> Result<Sent<HandoffReply>, Failed> {
        let proposal = first_proposal();
        let args = HandoffArgs {
            proposed_token: proposal,
            reserve: 0,
            ..args
        };
        let started = Instant::now();
        let replies = self.round_reporting::<HandoffReply>(
            &keys.lock,
            &keys.name,
            &calls::handoff(keys, args),
            args.lease,
        );
        let mut handed = Vec::new();
        let mut errors = Vec::new();
        for reply in &replies {
            match reply {
                Ok(HandoffReply {
                    fence: Some(fence), ..
                }) => handed.push(*fence),
                Ok(HandoffReply { fence: None, .. }) => {}
                Err(failed) => errors.push(&failed.error),
            }
        }
        if handed.is_empty() && errors.is_empty() {
            // Not the holder's on any master: its lock was lost.
            return Ok(Sent {
                value: HandoffReply::to(None),
                resent: false,
            });
        }
        // A master that did not answer may still hold the giver's copy.
        let in_part = !errors.is_empty();
        let error = if handed.len() >= self.quorum()
            && validity(args.lease, started.elapsed(), self.drift).is_some()
        {
            if let Some(token) = one_token(&handed) {
                return Ok(Sent {
                    value: HandoffReply {
                        in_part,
                        ..HandoffReply::to(Some(token))
                    },
                    resent: false,
                });
            }
            match self.agree_on_token(keys, args.to, &handed, args.lease, started) {
                Ok(token) => {
                    return Ok(Sent {
                        value: HandoffReply {
                            in_part,
                            ..HandoffReply::to(Some(token))
                        },
                        resent: false,
                    })
                }
                Err(error) => error,
            }
        } else {
            self.no_quorum(handed.len(), &errors)
        };
        Err(Failed {
            error,
            outcome_unknown: true,
        })
    }

    fn renew(
        &self,
        keys: &LockKeys,
        identity: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        self.renew_at(&keys.lock, &keys.name, identity, fence, lease)
    }

    fn undo_request(
        &self,
        keys: &LockKeys,
        identity: &str,
        request: u64,
        answered: &mut Answered,
    ) -> Result<(), Error> {
        // The reply was lost: the request may have won the lock.
        let call = calls::release_request(keys, identity, request, self.baton_ttl, false);
        self.finish::<Done>(keys, &call, self.default_lease, answered)
    }

    fn holder(&self, keys: &LockKeys) -> Result<Option<Holder>, Error> {
        let call = calls::holder(keys);
        let replies = self.round::<HolderReply>(&keys.lock, &keys.name, &call, self.default_lease);
        let errors: Vec<&Error> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
        if replies.len() - errors.len() < self.quorum() {
            return Err(self.no_quorum(replies.len() - errors.len(), &errors));
        }
        let mut seen: HashMap<(Owner, u64), Vec<Holder>> = HashMap::new();
        for HolderReply(row) in replies.into_iter().flatten() {
            if let Some(holder) = row.map(Holder::from) {
                seen.entry((holder.owner.clone(), holder.fencing_token))
                    .or_default()
                    .push(holder);
            }
        }
        Ok(seen
            .into_values()
            .find(|holders| holders.len() >= self.quorum())
            .and_then(|mut holders| {
                // The majority's shortest lease: when it ends, no majority
                // is left.
                holders.sort_by_key(|h| h.remaining_lease);
                holders.into_iter().next()
            }))
    }

    fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error> {
        self.holder(keys).map(|holder| holder.is_some())
    }

    fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error> {
        let call = calls::force_unlock(keys, self.baton_ttl);
        let replies = self.round::<Done>(&keys.lock, &keys.name, &call, self.default_lease);
        let removed = replies.iter().any(|r| matches!(r, Ok(Done(true))));
        let errors: Vec<&Error> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
        if replies.len() - errors.len() < self.quorum() {
            return Err(self.no_quorum(replies.len() - errors.len(), &errors));
        }
        Ok(removed)
    }
}

impl RenewLeases for QuorumLock {
    /// The masters' clocks may run faster than this one: the lease counts
    /// as ending a drift allowance early, so that `is_lost()` turns true
    /// when the validity ends, not the lease.
    fn clock_margin(&self, lease: Duration) -> Duration {
        self.drift.allowance(lease)
    }

    fn renew_round(&self, requests: &[RenewRequest<'_>]) -> Vec<RenewOutcome> {
        requests
            .iter()
            .map(
                |r| match self.renew_at(r.key, r.name, r.identity, r.fence, r.lease) {
                    Ok(true) => RenewOutcome::Renewed,
                    Ok(false) => RenewOutcome::Lost,
                    Err(_) => RenewOutcome::Retry,
                },
            )
            .collect()
    }
}

/// Whether a master answered that it does not have the script.
fn is_noscript(err: &Error) -> bool {
    matches!(err, Error::Redis { source } if source.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
}

/// A short random pause (5 to 35 ms) after a round that no contender won.
/// How much sooner than the holder's copies a copy may end and still be
/// taken for one of them: a round writes every master within a few
/// milliseconds, while a copy left behind by a hand-off or an undo that
/// missed its master is at least a hold older.
const COPY_SPREAD: Duration = Duration::from_millis(50);

/// Where a waiter parks, of the masters that found the lock `held` (index,
/// lease left): the first whose copy is the holder's (it ends with the
/// longest `quorum` of them), not a copy left behind that ends sooner.
fn parking_master(held: &[(usize, Duration)], quorum: usize) -> Option<usize> {
    let mut leases: Vec<Duration> = held.iter().map(|(_, lease)| *lease).collect();
    leases.sort();
    let holders = leases.get(leases.len().saturating_sub(quorum))?;
    let shortest = holders.saturating_sub(COPY_SPREAD);
    held.iter()
        .find(|(_, lease)| *lease >= shortest)
        .map(|(index, _)| *index)
}

fn tie_break_delay() -> Duration {
    let random = uuid::Uuid::new_v4().as_u128();
    Duration::from_millis(5 + (random % 31) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_park_where_the_holders_copies_are_not_on_a_copy_left_behind() {
        let ms = Duration::from_millis;
        // A copy left behind ends sooner than the holder's two.
        let held = [(0, ms(96)), (1, ms(2_999)), (2, ms(3_000))];
        assert_eq!(parking_master(&held, 2), Some(1));
        // The holder's copies, a few ms apart: the first of them.
        let held = [(0, ms(2_990)), (1, ms(2_999)), (2, ms(3_000))];
        assert_eq!(parking_master(&held, 2), Some(0));
        // Held on fewer than a majority (a split round): any of them.
        assert_eq!(parking_master(&[(2, ms(10))], 2), Some(2));
        assert_eq!(parking_master(&[], 2), None);
    }

    #[test]
    fn the_majority_of_odd_counts() {
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn validity_leaves_out_elapsed_time_and_drift_without_overflow() {
        let validity = |lease, elapsed| validity(lease, elapsed, ClockDrift::DEFAULT);
        let second = Duration::from_secs(1);
        // 1 s − 100 ms − (10 ms + 2 ms).
        assert_eq!(
            validity(second, Duration::from_millis(100)),
            Some(Duration::from_millis(888))
        );
        assert_eq!(validity(second, second), None);
        assert_eq!(validity(second, Duration::from_millis(988)), None);
        assert_eq!(validity(Duration::from_millis(1), Duration::ZERO), None);
        assert_eq!(
            validity(Duration::from_millis(3), Duration::ZERO),
            Some(Duration::from_micros(970))
        );
        assert_eq!(validity(Duration::ZERO, Duration::MAX), None);
        let year = Duration::from_secs(365 * 24 * 3600);
        assert!(validity(year, Duration::MAX).is_none());
        assert!(validity(year, Duration::ZERO).is_some());
    }

    #[test]
    fn a_configured_drift_is_what_validity_leaves_out() {
        let none = ClockDrift::new(0.0, Duration::ZERO).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(validity(ms(100), ms(40), none), Some(ms(60)));
        let tenth = ClockDrift::new(0.1, ms(5)).unwrap();
        assert_eq!(validity(ms(100), ms(40), tenth), Some(ms(45)));
        assert_eq!(validity(ms(100), ms(85), tenth), None);
    }

    #[test]
    fn the_proposed_token_is_above_every_granting_masters_token() {
        assert_eq!(proposed_token(&[7, 12, 9]), Some(13));
        assert_eq!(proposed_token(&[]), None);
        assert_eq!(proposed_token(&[u64::MAX]), None);
    }

    #[test]
    fn one_round_suffices_only_when_every_granting_master_issued_one_token() {
        assert_eq!(one_token(&[41, 41, 41]), Some(41));
        assert_eq!(one_token(&[41, 42, 41]), None);
        assert_eq!(one_token(&[]), None);
        let proposal = first_proposal();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert!(proposal >= now + 900_000 && proposal <= now + 1_100_000);
    }
}

//! The multi-lock: several lock names taken all or none. Built on the
//! single-name lock: a set is one script per cluster slot, or one Redlock
//! round of that script on a quorum (`lock/acquire_many.lua`, which takes
//! each name exactly as `lock/acquire.lua` would), and the guard holds one
//! ordinary [`LockGuard`] per name, so that renewals, release, loss and
//! clean-ups are the lock's own. A waiter holds nothing while it waits: it
//! parks on the baton of the first name found held, like any waiter of
//! that name, and retries the whole set when woken; after
//! `hold_back_after`, it takes the names one at a time for a bounded
//! window (`take_in_turn`), so that it is not starved.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::raw::{self, RawLock, ReleaseOne};
use super::{Lock, LockGuard};
use crate::context::Context;
use crate::error::Error;
use crate::lease::{earlier, Claim, Held, LeaseMode};
use crate::observe::{Acquisition, Event};
use crate::parking::{self, Attempt, Waited};
use crate::scripts::lock::{Asking, ManyArgs, ManyName};
use crate::scripts::reply::ManyReply;

/// A handle on several distributed locks taken together, made by
/// [`Client::multi_lock`]: a guard holds every name, and an attempt that
/// does not get every name leaves none of them held.
///
/// Each name is the plain [`Lock`] of that name: a multi-lock and a
/// `client.lock(name)` exclude each other on every name they share, and
/// each name keeps its own fencing token and lease. Cheap to clone,
/// `Send + Sync`.
///
/// Waiting holds nothing at first: a caller that finds a name held parks
/// on that name's baton as its other waiters do, and tries the whole set
/// again when woken. After [`MultiLock::hold_back_after`] it takes the
/// names one at a time in a global order, for a bounded time, so that
/// single-name lockers cannot starve it; multi-locks on overlapping sets
/// can neither deadlock nor hold each other off. See `docs/multi-lock.md`
/// for deployments, fairness and re-entry.
///
/// [`Client::multi_lock`]: crate::Client::multi_lock
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let transfer = client.multi_lock(["account:17", "account:4"])?;
/// let guard = transfer.lock()?; // both accounts, or (while waiting) neither
/// for (name, token) in guard.fencing_tokens() {
///     println!("{name}: fencing token {token}");
/// }
/// # drop(guard);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    context: Arc<Context>,
    /// One handle per name, deduplicated, in name order.
    locks: Vec<Lock>,
    /// Indices into `locks` grouped by cluster slot: groups in slot order,
    /// names in name order within a group. Sets are always taken in this
    /// global order (one group on one server, Sentinel or a Redlock
    /// quorum, whose every master holds every key).
    groups: Vec<Vec<usize>>,
    /// How long a waiter holds nothing before it takes its names one at a
    /// time ([`MultiLock::hold_back_after`]).
    hold_back_after: Duration,
}

/// The default of [`MultiLock::hold_back_after`].
const HOLD_BACK_AFTER: Duration = Duration::from_millis(100);

/// What one attempt at the whole set found.
enum Tried {
    Acquired(MultiLockGuard),
    /// `locks[index]` is held by another (or kept in its hand-over window
    /// for a waiter that asked first); nothing of the set is held.
    Held {
        index: usize,
        lease_left: Option<Duration>,
        handing_over: bool,
    },
}

/// What an attempt made from the wait loop gives the loop.
enum Step {
    Done(MultiLockGuard),
    /// Another name than the one waited on is in the way now: wait there.
    Moved(usize),
}

impl MultiLock {
    /// The set of `locks` (at least one, deduplicated, in name order).
    pub(crate) fn new(context: Arc<Context>, locks: Vec<Lock>) -> MultiLock {
        let keys: Vec<&str> = locks.iter().map(|lock| lock.keys.lock.as_str()).collect();
        let groups = context.backend.slot_groups(&keys);
        MultiLock {
            context,
            locks,
            hold_back_after: HOLD_BACK_AFTER,
            groups,
        }
    }

    /// The names dedup-sorted from those given, and whether they are valid
    /// (a multi-lock needs at least one).
    pub(crate) fn unique_names<S: AsRef<str>>(
        names: impl IntoIterator<Item = S>,
    ) -> Result<BTreeSet<String>, Error> {
        let names: BTreeSet<String> = names
            .into_iter()
            .map(|name| name.as_ref().to_owned())
            .collect();
        if names.is_empty() {
            return Err(Error::InvalidName {
                name: String::new(),
                reason: "a multi-lock needs at least one name",
            });
        }
        Ok(names)
    }

    /// The names of the set, deduplicated, in name order.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.locks.iter().map(Lock::name)
    }

    /// A handle on the same set whose acquisitions have a renewed `lease`
    /// of their own, as [`Lock::with_lease`] for each name.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms or over a year.
    pub fn with_lease(&self, lease: Duration) -> Result<MultiLock, Error> {
        self.map_locks(|lock| lock.with_lease(lease))
    }

    /// A handle on the same set whose acquisitions have a fixed `lease`
    /// (no renewal), as [`Lock::with_fixed_lease`] for each name.
    ///
    /// # Errors
    /// [`Error::InvalidLease`] for a lease under 1 ms or over a year.
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<MultiLock, Error> {
        self.map_locks(|lock| lock.with_fixed_lease(lease))
    }

    /// A handle on the same set whose waiters, once they have waited
    /// `after` holding nothing, take the names one at a time.
    ///
    /// A waiter needs every name free at the same moment, so single-name
    /// lockers that keep *some* name of the set held at every instant
    /// could keep it waiting for ever. To bound that, a waiter that has
    /// waited `after` takes the names one after the other in the set's
    /// global order (slot, then name), keeping those it has while it waits
    /// for the next, each as a plain waiter of that name: from then on it
    /// waits for each name no longer than that name's own waiters do. It
    /// keeps a partial set for at most one and a half `max_park` plus
    /// 500 ms (3.5 s by default); then it gives back what it took, waits
    /// holding nothing for the name that stopped it, and tries again.
    /// Taking in the global order means two such waiters never wait for
    /// each other in a cycle, and the time limit bounds how long a thread
    /// that holds one of the names and waits for another (nesting plain
    /// locks in some other order) can wait for it. Whatever happens, the
    /// caller ends with the whole set or with nothing of it. A shorter
    /// `after` is closer to first-come first-served; [`Duration::MAX`]
    /// never takes a partial set (nothing is held while waiting, but no
    /// bound against single-name lockers). Defaults to 100 ms.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let transfer = client
    ///     .multi_lock(["account:1", "account:2"])?
    ///     .hold_back_after(Duration::from_millis(20));
    /// let both = transfer.lock()?; // held back for at most about 20 ms
    /// # drop(both);
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_back_after(&self, after: Duration) -> MultiLock {
        MultiLock {
            hold_back_after: after,
            ..self.clone()
        }
    }

    fn map_locks(&self, with: impl Fn(&Lock) -> Result<Lock, Error>) -> Result<MultiLock, Error> {
        Ok(MultiLock {
            locks: self.locks.iter().map(with).collect::<Result<_, _>>()?,
            ..self.clone()
        })
    }

    /// Blocks until the calling thread holds every name of the set.
    ///
    /// Uncontended, one script call per cluster slot the names fall in
    /// (one on one server or Sentinel; on a Redlock quorum, one round: one
    /// script call per master), and as many to release.
    ///
    /// # Errors
    /// As [`Lock::lock`]; on error nothing of the set is held.
    pub fn lock(&self) -> Result<MultiLockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(None)? {
                return Ok(guard);
            }
        }
    }

    /// One attempt: the guard if every name was free (or already this
    /// thread's), `None` if any is held by another, and then none is held.
    /// Never waits.
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock).
    pub fn try_lock(&self) -> Result<Option<MultiLockGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let identity = self
            .context
            .identity()
            .map_err(|err| self.failed(start, err))?;
        let attempt = self.attempt(&identity, Asking::Once);
        match attempt.map_err(|err| self.failed(start, err))? {
            Tried::Acquired(guard) => {
                if let Some(start) = start {
                    self.announce(&guard, start, Acquisition::FirstAttempt);
                }
                Ok(Some(guard))
            }
            Tried::Held { .. } => Ok(None),
        }
    }

    /// Like [`lock`](MultiLock::lock), but gives up after `timeout` and
    /// returns `None`, holding none of the names. A timeout too large to be
    /// a point in time means no deadline.
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock).
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<MultiLockGuard>, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_lock_until(deadline),
            None => self.lock().map(Some),
        }
    }

    /// Like [`lock`](MultiLock::lock), but gives up at `deadline` and
    /// returns `None`, holding none of the names.
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire(Some(deadline))
    }

    /// Runs `critical_section` holding every name and returns its value.
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock); and [`Error::LockLost`] when a name
    /// was no longer this thread's at release: the value is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redbaton::Error> {
    /// # let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// let both = client.multi_lock(["stock:apples", "stock:pears"])?;
    /// let moved = both.with_lock(|| 3)?;
    /// assert_eq!(moved, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_lock<T>(&self, critical_section: impl FnOnce() -> T) -> Result<T, Error> {
        let guard = self.lock()?;
        let value = critical_section();
        guard.unlock()?;
        Ok(value)
    }

    /// [`MultiLock::wait_for_all`], told to the event hook: one
    /// `Acquired` per name, all at once.
    fn acquire(&self, deadline: Option<Instant>) -> Result<Option<MultiLockGuard>, Error> {
        let start = self.context.observer().is_set().then(Instant::now);
        let mut first_attempt = true;
        let taken = match self.wait_for_all(deadline, &mut first_attempt) {
            Ok(taken) => taken,
            // A wait that failed was told by the wait core; a first
            // attempt that failed is told here.
            Err(err) if first_attempt => return Err(self.failed(start, err)),
            Err(err) => return Err(err),
        };
        if let (Some(guard), Some(start)) = (&taken, start) {
            let how = if first_attempt {
                Acquisition::FirstAttempt
            } else {
                Acquisition::AfterWaiting
            };
            self.announce(guard, start, how);
        }
        Ok(taken)
    }

    /// Tells the event hook that an acquisition that started at `start`
    /// (`None`: no hook was set then) failed before any wait with `err`,
    /// once per name; returns `err`.
    fn failed(&self, start: Option<Instant>, err: Error) -> Error {
        let observer = self.context.observer();
        for lock in &self.locks {
            observer.acquire_failed(lock.name(), lock.kind(), start);
        }
        err
    }

    /// Tells the event hook of each name `taken` holds, got `how` after a
    /// call that started at `start`.
    fn announce(&self, taken: &MultiLockGuard, start: Instant, how: Acquisition) {
        let observer = self.context.observer();
        for held in &taken.guards {
            observer.emit(|| Event::Acquired {
                name: held.name(),
                kind: held.kind(),
                waited: start.elapsed(),
                fencing_token: Some(held.fencing_token()),
                how,
            });
        }
    }

    /// The first attempt, then waits, each on the name in the way, until
    /// `deadline`; `first_attempt` is cleared once it waits.
    fn wait_for_all(
        &self,
        deadline: Option<Instant>,
        first_attempt: &mut bool,
    ) -> Result<Option<MultiLockGuard>, Error> {
        // When this call started asking (see `Lock::acquire_from`).
        let asked = Instant::now();
        let context = &self.context;
        let identity =
            parking::ride_out(deadline, context.config.io_timeout, || context.identity())?;
        // A newcomer queues behind this process's waiters on any name it
        // does not hold yet, as a single-name newcomer does (no barging).
        let queued = self.locks.iter().position(|lock| {
            context.lock_room.has_waiters(&lock.keys.baton)
                && context
                    .leases
                    .registry
                    .held(&lock.keys.lock, &identity)
                    .is_none()
        });
        let mut index = match queued {
            Some(index) => index,
            None => match self.attempt(&identity, Asking::First) {
                Ok(Tried::Acquired(guard)) => return Ok(Some(guard)),
                Ok(Tried::Held { index, .. }) => index,
                // The wait loop rides out a failing Redis within the
                // deadline, as it does for its own attempts.
                Err(err) if err.is_transient() => {
                    log::debug!("redbaton: first attempt on a multi-lock failed: {err}");
                    0
                }
                Err(err) => return Err(err),
            },
        };
        *first_attempt = false;
        // When this waiter stops holding nothing and takes its names one at
        // a time (`None`: never).
        let mut patient_at = Instant::now().checked_add(self.hold_back_after);
        loop {
            let lock = &self.locks[index];
            // A fresh ownership of the one name on a hand-off, under this
            // thread's identity, as the set takes its other names.
            let claim = Claim {
                identity: Arc::clone(&identity),
                mode: lock.mode(),
                takes_passed: false,
            };
            let attempt = || {
                let asking = Asking::Waited(asked.elapsed());
                Ok(match self.attempt(&identity, asking)? {
                    Tried::Acquired(guard) => Attempt::Acquired(Step::Done(guard)),
                    Tried::Held {
                        index: other,
                        lease_left,
                        handing_over,
                    } if other == index => Attempt::Held {
                        lease_left,
                        handing_over,
                        park_on: None,
                        passed_on: false,
                    },
                    Tried::Held { index: other, .. } => {
                        // This waiter leaves this name for another, and the
                        // name's release's one baton may have woken it:
                        // pass it on to the name's other waiters (in other
                        // processes, for whom the release may have opened
                        // a hand-over window). A name before `other` in the
                        // set's order was free; one after it was not
                        // tried, and the baton may wake a waiter who finds
                        // it held and parks again.
                        lock.raw.pass_baton(&lock.keys);
                        Attempt::Acquired(Step::Moved(other))
                    }
                })
            };
            let (name, baton, watch) = (&lock.keys.name, &lock.keys.baton, Some(&*lock.keys.lock));
            let room = &context.lock_room;
            // Until the deadline, or a stretch until it is time to take the
            // names one at a time (reaching that is no time out).
            let waited = match patient_at.filter(|at| deadline.is_none_or(|d| *at < d)) {
                // Its attempts take no token: a look pops it for them.
                Some(at) => {
                    room.wait_a_stretch(name, baton, watch, claim, at, None, None, None, attempt)?
                }
                None => room.wait_until(
                    name, baton, watch, claim, deadline, None, None, None, attempt,
                )?,
            };
            match waited {
                Waited::Acquired(Step::Done(guard)) => return Ok(Some(guard)),
                Waited::Acquired(Step::Moved(other)) => {
                    // A parker looks before it parks, deadline or not: a
                    // set whose names are taken in turn must not keep it
                    // moving past its deadline.
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        return Ok(None);
                    }
                    index = other;
                }
                Waited::Granted(grant) => {
                    // A releasing thread of this process handed this one
                    // name over. Holding it alone is not the set: try the
                    // set now (re-entering this name), then let the
                    // handed-over guard go, leaving the set's guard, or
                    // nothing, behind.
                    let granted = lock.granted(&identity, grant);
                    let tried = self.attempt(&identity, Asking::Waited(asked.elapsed()));
                    drop(granted);
                    match tried {
                        Ok(Tried::Acquired(guard)) => return Ok(Some(guard)),
                        Ok(Tried::Held { index: other, .. }) => index = other,
                        Err(err) if err.is_transient() => {
                            log::debug!(
                                "redbaton: multi-lock attempt after a hand-off failed: {err}"
                            );
                        }
                        Err(err) => return Err(err),
                    }
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        return Ok(None);
                    }
                }
                Waited::TimedOut if deadline.is_some_and(|deadline| Instant::now() >= deadline) => {
                    return Ok(None)
                }
                Waited::TimedOut => {
                    // Waited long enough holding nothing: the names one at
                    // a time, within a window; or back to waiting for the
                    // name that stopped it.
                    match self.take_in_turn(deadline)? {
                        Ok(guard) => return Ok(Some(guard)),
                        Err(_) if deadline.is_some_and(|deadline| Instant::now() >= deadline) => {
                            return Ok(None)
                        }
                        Err(stopped) => index = stopped,
                    }
                    patient_at = Instant::now().checked_add(self.hold_back_after);
                }
            }
        }
    }

    /// Takes the names one at a time in the global order, each as a plain
    /// waiter of that name, keeping those taken while it waits for the
    /// next: the first until `deadline` (holding nothing meanwhile), the
    /// others until `deadline` and for one place's time at most (1.5
    /// `max_park` + 500 ms) from the first's: the set, or else (everything
    /// taken given back, last first) the index of the name that stopped it
    /// (or of a name taken and found lost by the end).
    ///
    /// Waiting for the first name has no window of its own: a waiter that
    /// holds nothing keeps no one waiting, and coming back at a window's
    /// end would only send the attempts of every such waiter again (many
    /// set waiters of one process queue behind the one that took the first
    /// name, and take it in turn when it gives its partial set back).
    fn take_in_turn(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Result<MultiLockGuard, usize>, Error> {
        // Set once the first name is held.
        let mut window: Option<Instant> = None;
        // Dropped on the way out unless complete: what it holds is
        // released, last first.
        let mut taken = MultiLockGuard {
            raw: Arc::clone(&self.locks[0].raw),
            guards: Vec::with_capacity(self.locks.len()),
            groups: Vec::with_capacity(self.groups.len()),
        };
        for group in &self.groups {
            // Counted before each name, so that what is given back is
            // released group by group (one slot's names together).
            taken.groups.push(0);
            for &index in group {
                let guard = match window {
                    None => self.locks[index].acquire_untold(deadline, true)?,
                    Some(window) => {
                        let until = deadline.map_or(window, |deadline| deadline.min(window));
                        let last = Some(until) == deadline;
                        self.locks[index].acquire_untold(Some(until), last)?
                    }
                };
                let Some(guard) = guard else {
                    return Ok(Err(index));
                };
                window.get_or_insert_with(|| Instant::now() + self.context.config.place_ttl());
                taken.guards.push(guard);
                if let Some(count) = taken.groups.last_mut() {
                    *count += 1;
                }
            }
        }
        // A name taken before the last may have been lost while this waited
        // for a later one, and someone else may hold it now: its renewals
        // failed until its lease ended, or Redis no longer has it (a
        // Sentinel failover to a replica that never had it, which no
        // renewal has met yet). A set with a lost name is no set: each is
        // checked, locally and then in Redis (one owner-checked read each,
        // on this path only), and the set given back at the first lost one,
        // to wait for that name.
        let earlier = taken.guards.len().saturating_sub(1);
        let order = self.groups.iter().flatten().zip(&taken.guards);
        let order = || order.clone().take(earlier);
        let lost = order()
            .find(|(_, guard)| guard.is_lost())
            .or_else(|| order().find(|(_, guard)| guard.remaining_lease().is_err()))
            .map(|(&index, _)| index);
        if let Some(lost) = lost {
            // The lost name's release is refused, as expected here: no
            // warning (the drop's) for it.
            if let Err(err) = taken.release() {
                log::debug!("redbaton: a partial set with a lost name given back: {err}");
            }
            return Ok(Err(lost));
        }
        Ok(Ok(taken))
    }

    /// One attempt at the whole set: slot group after slot group in the
    /// global order; a group that finds a name held undoes the groups
    /// taken before it (released in reverse order).
    fn attempt(&self, identity: &Arc<str>, asking: Asking) -> Result<Tried, Error> {
        // Dropped on the way out when a group fails: the groups taken
        // before it are released, last first.
        let mut taken = MultiLockGuard {
            raw: Arc::clone(&self.locks[0].raw),
            guards: Vec::with_capacity(self.locks.len()),
            groups: Vec::with_capacity(self.groups.len()),
        };
        for group in &self.groups {
            if let Some(held) = self.attempt_group(identity, asking, group, &mut taken.guards)? {
                return Ok(held);
            }
            taken.groups.push(group.len());
        }
        Ok(Tried::Acquired(taken))
    }

    /// One script over the names `group` (indices into `locks`, one slot;
    /// on a quorum, the whole set in one round of that script): pushes
    /// their guards onto `taken`, or says which name is held.
    fn attempt_group(
        &self,
        identity: &Arc<str>,
        asking: Asking,
        group: &[usize],
        taken: &mut Vec<LockGuard>,
    ) -> Result<Option<Tried>, Error> {
        let context = &self.context;
        let registry = &context.leases.registry;
        // As for one name: re-entry only into the ownership this thread's
        // live guards belong to, under that ownership's lease and the
        // identity it is held as in Redis.
        let held: Vec<(Option<Held>, bool)> = group
            .iter()
            .map(|&index| {
                let key = &self.locks[index].keys.lock;
                let held = registry.held(key, identity);
                let lent = held.is_none() && registry.lent(key, identity);
                (held, lent)
            })
            .collect();
        let names: Vec<(ManyName<'_>, LeaseMode, &Arc<str>)> = group
            .iter()
            .zip(&held)
            .map(|(&index, (held, lent))| {
                let lock = &self.locks[index];
                let (owner, held_fence, guards, mode) = match held {
                    Some(held) => (&held.identity, held.fence, held.guards, held.mode),
                    None => (identity, 0, 0, lock.mode()),
                };
                let name = ManyName {
                    keys: &lock.keys,
                    lease: mode.lease(),
                    held_fence,
                    depth: guards + 1,
                    stamp: if held.is_some() { owner } else { "" },
                    free_only: *lent,
                };
                (name, mode, owner)
            })
            .collect();
        let raw = &self.locks[group[0]].raw;
        let request = context.next_request();
        let args = ManyArgs {
            identity,
            fence_ttl: context.config.fence_ttl,
            request,
            asking,
            proposed_token: 0,
            reserve: super::guard::reserve(context, &**raw),
        };
        let calls: Vec<ManyName<'_>> = names.iter().map(|(name, ..)| *name).collect();
        let sent = Instant::now();
        match raw.attempt_many(&calls, args) {
            Ok(ManyReply::Acquired(pairs)) => {
                for ((&index, (_, mode, owner)), (fence, _)) in group.iter().zip(&names).zip(pairs)
                {
                    let sent = earlier(sent, raw.clock_margin(mode.lease()));
                    taken.push(self.locks[index].guard(identity, owner, fence, *mode, sent, None));
                }
                Ok(None)
            }
            Ok(ManyReply::Held {
                index,
                lease_left,
                handing_over,
            }) => Ok(Some(Tried::Held {
                index: group[index],
                lease_left,
                handing_over,
            })),
            Err(failed) => {
                if failed.outcome_unknown {
                    // The script may have run and taken the names for a
                    // guard that will never exist: undo each once Redis
                    // answers (a name only this request took; re-entered
                    // names keep their request and are left alone).
                    for (&index, (_, mode, _)) in group.iter().zip(&names) {
                        let lock = &self.locks[index];
                        let undo = raw::undo_later(
                            &lock.raw,
                            &lock.keys,
                            identity,
                            request,
                            mode.lease(),
                            sent,
                        );
                        context.finish_later(undo);
                    }
                }
                Err(failed.error)
            }
        }
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Held while the calling thread owns every name of a [`MultiLock`]: one
/// [`LockGuard`] per name, released in the reverse of the order they were
/// taken in when dropped or [`unlock`](MultiLockGuard::unlock)ed.
///
/// Each name keeps its own ownership: its own fencing token, its lease
/// renewed by the watchdog in its usual rounds, its own loss. A guard is
/// `!Send`, as a [`LockGuard`] is.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redbaton::MultiLockGuard>();
/// ```
#[must_use = "the locks are released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct MultiLockGuard {
    raw: Arc<dyn RawLock>,
    /// In the order taken: slot, then name.
    guards: Vec<LockGuard>,
    /// How many of `guards` each slot's group holds, in order.
    groups: Vec<usize>,
}

impl MultiLockGuard {
    /// Each name with its fencing token, in the order the names were taken
    /// (cluster slot, then name; name order on one server).
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.guards
            .iter()
            .map(|guard| (guard.name(), guard.fencing_token()))
    }

    /// The fencing token of `name`, or `None` when the set has no such
    /// name.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.guard(name).map(LockGuard::fencing_token)
    }

    /// The guard of `name` in the set, or `None` when it has no such name:
    /// its lease, validity and loss, one name at a time.
    pub fn guard(&self, name: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|guard| guard.name() == name)
    }

    /// Whether any name of the set can no longer be counted on (see
    /// [`LockGuard::is_lost`]). No network call.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// The earliest [`LockGuard::valid_until`] of the set's names: work
    /// that needs every name should finish before it. No network call.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Releases every name, last slot first, and reports the first
    /// failure. Every release is sent, whatever the others' outcome: the
    /// names of one slot together, in one round trip (on a Redlock quorum,
    /// one round: one script per master), unless a name goes to a waiter
    /// of this process (a local hand-off, as a [`LockGuard`]'s release
    /// does).
    ///
    /// # Errors
    /// As [`LockGuard::unlock`], for the first name whose release failed.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        let mut first = Ok(());
        let mut keep = |outcome: Result<(), Error>| {
            if first.is_ok() {
                first = outcome;
            }
        };
        let mut end = self.guards.len();
        for &size in self.groups.iter().rev() {
            let start = end.saturating_sub(size);
            let group = &mut self.guards[start..end];
            end = start;
            // (place in the group, guards left) of each release to send.
            let mut pending = Vec::with_capacity(group.len());
            for (place, guard) in group.iter_mut().enumerate().rev() {
                match guard.leave() {
                    Ok(Some(left)) => pending.push((place, left)),
                    Ok(None) => guard.announce_release(&Ok(())),
                    Err(err) => {
                        let outcome = Err(err);
                        guard.announce_release(&outcome);
                        keep(outcome);
                    }
                }
            }
            if pending.is_empty() {
                continue;
            }
            let batch: Vec<ReleaseOne<'_>> = pending
                .iter()
                .map(|&(place, left)| group[place].release_one(left))
                .collect();
            let sent = Instant::now();
            let replies = self.raw.release_many(&batch);
            drop(batch);
            for (&(place, left), reply) in pending.iter().zip(replies) {
                let outcome = group[place].settle_release(reply, left, sent);
                group[place].announce_release(&outcome);
                keep(outcome);
            }
        }
        // Each guard has been released: dropping them sends nothing more.
        self.guards.clear();
        first
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        if self.guards.is_empty() {
            return;
        }
        if let Err(err) = self.release() {
            log::warn!("redbaton: releasing a multi-lock on drop failed: {err}");
        }
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}

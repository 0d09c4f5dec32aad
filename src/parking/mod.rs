//! The wait core: how a thread that lost the race waits without spinning,
//! for any synchronizer. It knows baton keys, the backend and errors; it
//! does not know locks or leases (what a waiter asks for and what a grant
//! gives are type parameters).
//!
//! In Redis, a waiter parks on a baton list for min(time left
//! before its deadline, the holder's remaining lease + a margin, the maximum
//! park time). It wakes with a baton (the holder released) or by timeout
//! (the holder's lease ran out, or it is time to look again), and then makes
//! one attempt, even when its deadline has just passed, so a baton it took
//! is never dropped unused. How the backend parks is its own business: on
//! each server (one server, Sentinel's master, a quorum's masters, each
//! node of a Cluster), every waiter shares two connections, woken by the
//! server's announcements of changed baton lists (`backend::hub`).
//!
//! A waiter may name a *watch key*: a key whose absence means its object
//! is free (a plain lock's hash). Where the backend checks watch keys for
//! its waiters (one server, Sentinel, each node of a Cluster: the hub's
//! sweeper, every `max_park`), such a waiter parks until its holder's lease ends, its
//! deadline, or [`WATCHED_PARK_FACTOR`] × `max_park`, instead of looking
//! every `max_park`: what the look was for (a wake-up no baton brings: a
//! baton taken by a process that died before using it, a key deleted or
//! evicted) is the sweep's to notice. Waiters that keep a place in Redis
//! (a fair lock's queue, a semaphore's or a writer's waiting place) still
//! come back every `max_park`: that return is what keeps their place.
//!
//! Inside one process, threads waiting on the same baton key queue up (see
//! `local_queue`): one of them (the *parker*) waits in Redis for all, the
//! others sleep until a releasing thread of this process hands them what
//! they wait for, or until it is their turn to park. So a process holds at
//! most one parked connection per key, however many of its threads wait. A
//! newcomer queues behind waiting threads instead of barging in, and a run
//! of local hand-offs is bounded, so that other processes get their turn.

mod local_queue;
mod park;

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, GrantReceipt, ParkHow, Parked};
use crate::config::Config;
use crate::error::Error;
use crate::keys;
use crate::observe::{Event, Observer};

pub(crate) use local_queue::{Reservation, Turn};
pub(crate) use park::ride_out;

use local_queue::{LocalQueues, Member};
use park::{park_duration, Failures};

/// How many times `max_park` a waiter whose watch key the backend checks
/// parks at most without looking: a backstop for a sweep that cannot run,
/// not what bounds a lost wake-up.
pub(crate) const WATCHED_PARK_FACTOR: u32 = 10;

/// The first sleep of a multi-lock's caller kept out of a plain lock's
/// hand-over window before it looks again (see [`Attempt::Held`]); each
/// next one is twice as long, up to [`LAST_WINDOW_LOOK`] and the window's
/// time left.
const FIRST_WINDOW_LOOK: Duration = Duration::from_millis(1);

/// The longest a caller kept out of a hand-over window parks (a plain
/// lock's waiter) or sleeps (a multi-lock's) before it looks again: a
/// window whose waiter never comes (100 ms) costs it about a dozen looks,
/// and its waiter's own part (10 ms, the lock's `KEPT_ONLY_US`) one or two.
const LAST_WINDOW_LOOK: Duration = Duration::from_millis(10);

/// What one attempt found.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    /// Ours.
    Acquired(T),
    /// Someone else holds it; their lease ends in `lease_left` (`None`: no
    /// expiry, so only a release will free it). `handing_over`: nobody
    /// holds it, but it is kept for `lease_left` for a waiter that asked
    /// before this caller (a plain lock's hand-over window): the caller
    /// looks again within that time, parked if its attempts name its baton
    /// (they leave or put back the token meant for that waiter), else
    /// asleep (see [`FIRST_WINDOW_LOOK`]), so as not to take the baton
    /// meant for that waiter. `park_on`: a list to park on instead of the
    /// wait's baton (`None`: the baton), which only this caller's token
    /// goes to (a semaphore's waiter that holds newcomers back, a fair
    /// lock's head); this thread stays in its place in the process's queue
    /// for the baton.
    /// `passed_on`: the attempt passed the tokens of the list on to other
    /// waiters, so the park leaves them there
    /// ([`ParkHow::after_change`](crate::backend::ParkHow)).
    Held {
        lease_left: Option<Duration>,
        handing_over: bool,
        park_on: Option<ParkOn>,
        passed_on: bool,
    },
}

/// A list a waiter parks on instead of its wait's baton (see
/// [`Attempt::Held`]).
#[derive(Debug)]
pub(crate) struct ParkOn {
    pub(crate) list: String,
    /// The waiter's next attempt pops that list's token itself when the
    /// list's change ended its park ([`ParkHow::claims`](crate::backend::ParkHow)):
    /// its attempt is given the list. Otherwise a look pops it.
    pub(crate) claims: bool,
}

impl<T> Attempt<T> {
    /// The same attempt with what an acquisition gives made into another
    /// thing (a synchronizer's own guard).
    pub(crate) fn map<U>(self, acquired: impl FnOnce(T) -> U) -> Attempt<U> {
        match self {
            Attempt::Acquired(value) => Attempt::Acquired(acquired(value)),
            Attempt::Held {
                lease_left,
                handing_over,
                park_on,
                passed_on,
            } => Attempt::Held {
                lease_left,
                handing_over,
                park_on,
                passed_on,
            },
        }
    }
}

/// What a wait waits on (see [`WaitingRoom::wait_until`]).
#[derive(Clone, Copy)]
struct Wait<'a> {
    /// The object waited for, for messages.
    name: &'a str,
    baton_key: &'a str,
    watch: Option<&'a str>,
    takes_token: Option<&'a Cell<bool>>,
    grant: Option<&'a GrantSlot>,
}

/// What a waiter that may be granted what it waits for while parked (a
/// release writes its ownership and tells its client, see
/// `backend::grants`) shares with the wait core: the ticket its parks
/// carry, which its attempts set, and what a grant brought, which its
/// next attempt takes instead of asking Redis.
#[derive(Debug, Default)]
pub(crate) struct GrantSlot {
    ticket: RefCell<Option<String>>,
    granted: RefCell<Option<GrantReceipt>>,
}

impl GrantSlot {
    /// What the waiter's parks carry from now on (`None`: no grant may
    /// come to them).
    pub(crate) fn set_ticket(&self, ticket: Option<String>) {
        *self.ticket.borrow_mut() = ticket;
    }

    /// What a grant brought since the last call, if one came.
    pub(crate) fn take_granted(&self) -> Option<GrantReceipt> {
        self.granted.borrow_mut().take()
    }
}

/// How a wait ended.
#[derive(Debug)]
pub(crate) enum Waited<T, G> {
    /// An attempt of this thread succeeded.
    Acquired(T),
    /// A releasing thread of this process handed it over.
    Granted(G),
    /// The deadline passed.
    TimedOut,
}

/// Where the threads of one client wait: the local queues of every baton
/// key, and the way to park in Redis. `C` is what a waiter carries (who it
/// is, what it asks for), `G` what a local hand-off gives it.
#[derive(Debug)]
pub(crate) struct WaitingRoom<C, G> {
    queues: LocalQueues<C, G>,
    backend: Arc<Backend>,
    max_park: Duration,
    io_timeout: Duration,
    /// Told when a thread starts and stops waiting.
    observer: Observer,
    /// The key prefix, to tell the observer what a baton key is waited
    /// for.
    prefix: String,
}

impl<C: Clone, G: Clone> WaitingRoom<C, G> {
    /// A room whose releasing threads hand over to its waiters, as
    /// `config` bounds the runs.
    pub(crate) fn new(backend: Arc<Backend>, config: &Config) -> Self {
        Self::with_hand_offs(backend, config, config.max_local_handoffs)
    }

    /// A room whose waiters are never handed anything by a releasing
    /// thread (they only take turns to park): none of them stays awake
    /// for a hand-off before it sleeps.
    pub(crate) fn without_hand_offs(backend: Arc<Backend>, config: &Config) -> Self {
        Self::with_hand_offs(backend, config, 0)
    }

    fn with_hand_offs(backend: Arc<Backend>, config: &Config, hand_offs: u32) -> Self {
        WaitingRoom {
            queues: LocalQueues::new(hand_offs, config.max_local_run),
            backend,
            max_park: config.max_park,
            io_timeout: config.io_timeout,
            observer: config.observer.clone(),
            prefix: config.prefix.clone(),
        }
    }

    /// Whether threads of this client wait on `baton_key`: a newcomer then
    /// queues behind them instead of trying first (no barging).
    pub(crate) fn has_waiters(&self, baton_key: &str) -> bool {
        self.queues.has_waiters(baton_key)
    }

    /// For a thread releasing for good: reserves a waiter on `baton_key`
    /// that is not parked in Redis (the oldest, or one still awake: see
    /// [`LocalQueues::reserve`]), unless there is none or the run of local
    /// hand-offs is at its limit.
    pub(crate) fn reserve(&self, baton_key: &str) -> Option<Reservation<C, G>> {
        self.queues.reserve(baton_key)
    }

    /// For a thread releasing for good: reserves the waiter parked in Redis
    /// for `baton_key`, a waiter alone on its own list (see
    /// [`LocalQueues::reserve_parker`]).
    pub(crate) fn reserve_parker(&self, baton_key: &str) -> Option<Reservation<C, G>> {
        self.queues.reserve_parker(baton_key)
    }

    /// Released in Redis (baton pushed): a new run of local hand-offs may
    /// start.
    pub(crate) fn released_globally(&self, baton_key: &str) {
        self.queues.released_globally(baton_key);
    }

    /// Waits on `baton_key` (of the object `name`, for messages) until
    /// `attempt` succeeds, a local releaser grants, or `deadline` passes
    /// (`None`: no deadline). The waiter carries `claim`. `watch`: a key
    /// whose absence means the object is free, if there is one (see the
    /// module's docs).
    ///
    /// Redis failing meanwhile is ridden out until the deadline (without
    /// one, for the I/O timeout of failures in a row); then the last error
    /// is returned rather than `TimedOut`, so that the caller can tell
    /// "Redis was failing" from "someone else held it".
    ///
    /// `takes_token`: the caller's attempt can take the baton key's token
    /// itself (a lock's, a read's, a write's, a semaphore's); the wait
    /// core sets it before an attempt that should, after a park that ended
    /// with the list's change ([`Parked::Rang`]), and the attempt clears
    /// it. `None`: the waiter's tokens are popped for it by a look.
    ///
    /// `first`: what the attempt the caller made just before found, when
    /// another attempt made now would find nothing more (a fair lock's, a
    /// semaphore's, a writer's: both take or keep the waiter's place). A
    /// waiter that parks at once, with nobody of this process waiting
    /// before it, parks on it without attempting again. `None`: it
    /// attempts first.
    ///
    /// `grant`: the waiter may be granted what it waits for while parked
    /// (see [`GrantSlot`]); its attempt after such a park takes the grant.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wait_until<T>(
        &self,
        name: &str,
        baton_key: &str,
        watch: Option<&str>,
        claim: C,
        deadline: Option<Instant>,
        takes_token: Option<&Cell<bool>>,
        grant: Option<&GrantSlot>,
        first: Option<Attempt<T>>,
        attempt: impl FnMut() -> Result<Attempt<T>, Error>,
    ) -> Result<Waited<T, G>, Error> {
        let wait = Wait {
            name,
            baton_key,
            watch,
            takes_token,
            grant,
        };
        self.wait_told(wait, claim, deadline, true, first, attempt)
    }

    /// [`wait_until`](WaitingRoom::wait_until) for one stretch of a longer
    /// wait: reaching `until` is not the caller's time out, so the event
    /// hook is not told of one (the caller goes on waiting another way).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wait_a_stretch<T>(
        &self,
        name: &str,
        baton_key: &str,
        watch: Option<&str>,
        claim: C,
        until: Instant,
        takes_token: Option<&Cell<bool>>,
        grant: Option<&GrantSlot>,
        first: Option<Attempt<T>>,
        attempt: impl FnMut() -> Result<Attempt<T>, Error>,
    ) -> Result<Waited<T, G>, Error> {
        let wait = Wait {
            name,
            baton_key,
            watch,
            takes_token,
            grant,
        };
        self.wait_told(wait, claim, Some(until), false, first, attempt)
    }

    /// A wait, told to the event hook; a time out only when `final_end`.
    fn wait_told<T>(
        &self,
        wait: Wait<'_>,
        claim: C,
        deadline: Option<Instant>,
        final_end: bool,
        first: Option<Attempt<T>>,
        attempt: impl FnMut() -> Result<Attempt<T>, Error>,
    ) -> Result<Waited<T, G>, Error> {
        let wait = Wait {
            watch: wait.watch.filter(|_| self.backend.watches()),
            ..wait
        };
        if !self.observer.is_set() {
            return self.wait_in_queue(wait, claim, deadline, first, attempt);
        }
        let name = wait.name;
        let kind = keys::kind_waited_on(&self.prefix, name, wait.baton_key);
        let start = Instant::now();
        self.observer.emit(|| Event::Parked { name, kind });
        let waited = self.wait_in_queue(wait, claim, deadline, first, attempt);
        let elapsed = start.elapsed();
        self.observer.emit(|| Event::Woken {
            name,
            waited: elapsed,
        });
        match (&waited, kind) {
            (Ok(Waited::TimedOut), _) if final_end => self.observer.emit(|| Event::TimedOut {
                name,
                waited: elapsed,
            }),
            // A latch's failed wait was no acquisition.
            (Err(_), Some(kind)) => self.observer.emit(|| Event::AcquireFailed {
                name,
                kind,
                waited: elapsed,
            }),
            _ => {}
        }
        waited
    }

    /// [`wait_until`](WaitingRoom::wait_until)'s work.
    fn wait_in_queue<T>(
        &self,
        wait: Wait<'_>,
        claim: C,
        deadline: Option<Instant>,
        first: Option<Attempt<T>>,
        mut attempt: impl FnMut() -> Result<Attempt<T>, Error>,
    ) -> Result<Waited<T, G>, Error> {
        let member = self.queues.join(wait.baton_key, claim);
        // The caller's attempt still stands for a waiter that parks at
        // once; one that waited in the queue first attempts again.
        if first.is_some() && member.park_at_once() {
            return self.park_until_acquired(wait, &member, deadline, first, attempt);
        }
        loop {
            match member.next_turn(deadline) {
                Turn::TimedOut => return Ok(Waited::TimedOut),
                // Any acquisition ends the queue's run of unconfirmed
                // writes (a hand-off under `replica_acks` was confirmed).
                Turn::Granted(grant) => {
                    member.end_unconfirmed_run();
                    return Ok(Waited::Granted(grant));
                }
                Turn::Retry => match attempt() {
                    Ok(Attempt::Acquired(value)) => {
                        member.end_unconfirmed_run();
                        return Ok(Waited::Acquired(value));
                    }
                    Ok(Attempt::Held { .. }) => {}
                    // Redis is failing: the parker meets that too, and
                    // reports it after riding it out; wait on meanwhile.
                    Err(err) if err.is_transient() => {
                        log::debug!("redbaton: retry after a failed hand-off failed: {err}");
                    }
                    Err(err) => return Err(err),
                },
                // Leaving, whichever way, hands the parker role on
                // (`Member`'s drop).
                Turn::Park => {
                    return self.park_until_acquired(wait, &member, deadline, None, attempt)
                }
            }
        }
    }

    /// The parker's loop: attempt, park in Redis, attempt again.
    /// `first`: what an attempt made just before found, which stands for
    /// the loop's first attempt.
    fn park_until_acquired<T>(
        &self,
        wait: Wait<'_>,
        member: &Member<'_, C, G>,
        deadline: Option<Instant>,
        first: Option<Attempt<T>>,
        attempt: impl FnMut() -> Result<Attempt<T>, Error>,
    ) -> Result<Waited<T, G>, Error> {
        let parked = self.park_loop(wait, member, deadline, first, attempt);
        if let Ok(Waited::Acquired(_) | Waited::Granted(_)) = parked {
            return parked;
        }
        // Leaving without the lock, whatever the reason: a releasing
        // thread of this process may have handed it over meanwhile, and
        // it is this thread's then (see `LocalQueues::reserve_parker`).
        match member.parker_leaves() {
            Some(grant) => {
                member.end_unconfirmed_run();
                Ok(Waited::Granted(grant))
            }
            None => parked,
        }
    }

    /// [`park_until_acquired`](WaitingRoom::park_until_acquired)'s loop.
    fn park_loop<T>(
        &self,
        wait: Wait<'_>,
        member: &Member<'_, C, G>,
        deadline: Option<Instant>,
        mut first: Option<Attempt<T>>,
        mut attempt: impl FnMut() -> Result<Attempt<T>, Error>,
    ) -> Result<Waited<T, G>, Error> {
        // A run of unconfirmed writes a previous parker gave up on goes on:
        // otherwise each thread of the queue would wait out its own.
        let mut failures = Failures::resume(self.io_timeout, member.unconfirmed_run());
        // The previous parker gave up on that run: so does this one.
        if let Err(err) = failures.check_unconfirmed(deadline) {
            return Err(*err);
        }
        let Wait {
            name,
            baton_key,
            watch,
            takes_token,
            grant,
        } = wait;
        let max_park = match watch {
            Some(_) => self.max_park.saturating_mul(WATCHED_PARK_FACTOR),
            None => self.max_park,
        };
        // How long a caller kept out of a hand-over window sleeps before it
        // looks again.
        let mut window_look = FIRST_WINDOW_LOOK;
        loop {
            // Handed the lock while parked (or between two parks).
            if let Some(grant) = member.parker_turn() {
                member.end_unconfirmed_run();
                return Ok(Waited::Granted(grant));
            }
            // The previous parker may have left because it acquired, so
            // look before parking (unless the caller just did).
            let attempted = match first.take() {
                Some(found) => Ok(found),
                None => attempt(),
            };
            let (lease_left, park_on, passed_on) = match attempted {
                Ok(Attempt::Acquired(value)) => {
                    member.end_unconfirmed_run();
                    return Ok(Waited::Acquired(value));
                }
                Ok(Attempt::Held {
                    lease_left,
                    handing_over,
                    park_on,
                    passed_on,
                }) => {
                    if let Err(err) = failures.answered(deadline) {
                        return Err(*err);
                    }
                    if handing_over && takes_token.is_some() {
                        // A waiter whose attempt names its baton parks
                        // through the window, for `LAST_WINDOW_LOOK` at
                        // most (and the margin of a park past a lease's
                        // end): its attempt leaves the token it was rung
                        // for to the waiter the window is kept for, and
                        // puts back one a look popped for it (the lock's
                        // `tell_kept_waiter`); where a hub parks it, its
                        // park leaves the token there (`after_change`). The
                        // window's waiter taking the lock rings it (its pop
                        // of the token), or the park's end does; either way
                        // the window marked it the next one's waiter (the
                        // lock's `mark_next`).
                        window_look = FIRST_WINDOW_LOOK;
                        let left =
                            lease_left.map_or(LAST_WINDOW_LOOK, |left| left.min(LAST_WINDOW_LOOK));
                        (Some(left), park_on, true)
                    } else if handing_over {
                        // Parked, this waiter could pop the baton that
                        // wakes the waiter the lock is kept for, and not
                        // use it. So it sleeps, and looks again: the
                        // waiter usually takes the lock within a few round
                        // trips of the window's opening, and this one then
                        // parks behind it, rather than sleep out the
                        // window's time left (the lock's
                        // `HAND_OVER_WINDOW`). Each sleep is twice the one
                        // before, up to `LAST_WINDOW_LOOK`. It ends at the
                        // deadline at the latest.
                        let now = Instant::now();
                        if deadline.is_some_and(|deadline| now >= deadline) {
                            return Ok(Waited::TimedOut);
                        }
                        let left = lease_left.unwrap_or(Duration::ZERO).min(window_look);
                        window_look = window_look.saturating_mul(2).min(LAST_WINDOW_LOOK);
                        let until =
                            deadline.map_or(now + left, |deadline| deadline.min(now + left));
                        std::thread::sleep(until.saturating_duration_since(now));
                        continue;
                    } else {
                        window_look = FIRST_WINDOW_LOOK;
                        (lease_left, park_on, passed_on)
                    }
                }
                Err(err) if err.is_transient() => {
                    let counted = failures.back_off(err, deadline);
                    member.set_unconfirmed_run(failures.unconfirmed_run());
                    counted?;
                    continue;
                }
                Err(err) => return Err(err),
            };
            let Some(park) = park_duration(Instant::now(), lease_left, deadline, max_park) else {
                return Ok(Waited::TimedOut);
            };
            let park_key = park_on.as_ref().map_or(baton_key, |on| on.list.as_str());
            member.parker_parks(park_key);
            // On its own list, or on one its attempt pops.
            let claims = takes_token.filter(|_| park_on.as_ref().is_none_or(|on| on.claims));
            // A grant names the waiter by its ticket and the list it
            // parks on.
            let ticket = grant.map(|slot| slot.ticket.borrow());
            let how = ParkHow {
                precise: park.precise,
                watch,
                after_change: passed_on,
                claims: claims.is_some(),
                ticket: ticket.as_ref().and_then(|ticket| ticket.as_deref()),
            };
            let parked = self.backend.park(name, park_key, park.duration, how);
            drop(ticket);
            match parked? {
                Parked::Done => {}
                // The list changed: its token, if there, is this waiter's
                // to take, as a look would have popped it for it.
                Parked::Rang => {
                    if let Some(takes) = claims {
                        takes.set(true);
                    }
                }
                // A killed or reset parked connection: look again at once,
                // on a fresh connection.
                Parked::ConnectionFailed(err) => {
                    failures.count(err, deadline)?;
                }
                // Granted: the next attempt takes it, with no command.
                Parked::Granted(receipt) => {
                    if let Some(slot) = grant {
                        *slot.granted.borrow_mut() = Some(receipt);
                    }
                }
            }
        }
    }
}

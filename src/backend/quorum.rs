//! Several independent masters for a Redlock quorum: a [`Backend`] per
//! master (each a `single`), for the quorum lock to fan its exchanges out
//! to. Here only what is not per master:
//!
//! - a round: one request sent to every master at once, connections
//!   opened for all of them at once too, every reply read within one
//!   timeout, so that a round costs its slowest answering master, or one
//!   timeout, never one per master that does not answer;
//! - suspects: a master that could not be reached, or did not answer in
//!   time, is left out of the next rounds (while the others make a
//!   majority) and probed in the background until it answers. A SIGSTOPped
//!   master still accepts connections (the kernel does) but never answers
//!   one, so without this every round would open a fresh connection to it
//!   and wait the whole timeout;
//! - parking, on one reachable master at a time (the releaser pushes a
//!   baton on every master where it held the lock), moving on to the next
//!   when that one fails. A waiter parks where its last round found the
//!   lock held when it can (`prefer_parking`), on one of the holder's
//!   copies: the holder may hold only a majority, and the master it does
//!   not hold gets no baton when it releases. A release that master did
//!   not answer is sent again in the background until it does, and wakes
//!   the waiters there then; and when this client finds a master not
//!   answering, its waiters parked there look again at once and park on
//!   one that answers.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::pool::PooledConn;
use super::single::{SendError, Single};
use super::{Backend, Failed, Flavor, ParkHow, Parked};
use crate::error::Error;
use crate::observe::{Event, Observer};

/// How long a probe of a suspect master rests after its first failure;
/// it doubles with each failure after that, up to [`PROBE_REST_MAX`].
const PROBE_REST: Duration = Duration::from_millis(100);

/// The longest rest between two probes of a master that stays down.
const PROBE_REST_MAX: Duration = Duration::from_secs(1);

thread_local! {
    /// The master this thread's next park on a quorum goes to, if it can:
    /// (the quorum, by address; the master's index). Set by the round the
    /// waiter makes right before it parks (the wait loop always attempts,
    /// then parks, on one thread), so one slot per thread is enough.
    static PREFERRED: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

pub(super) struct Quorum {
    masters: Vec<Arc<Backend>>,
    /// Whether each master (same order) is suspect.
    health: Vec<Arc<Health>>,
    /// Told when a master turns suspect, and when it is back.
    observer: Observer,
    /// The master waiters park on.
    parking: AtomicUsize,
    /// For messages: every master's address.
    addrs: String,
}

/// What the rounds know of one master.
#[derive(Debug, Default)]
struct Health {
    /// It failed to answer in its last round and has answered nothing
    /// since: rounds leave it out while the others make a majority.
    suspect: AtomicBool,
    /// A probe thread runs for it.
    probing: AtomicBool,
}

/// One master's part of a round, between sending and reading.
enum Part<'env, 'scope> {
    /// Sent on an idle connection; the reply is read after every master
    /// was sent its request.
    Sent(&'env Single, PooledConn),
    /// No idle connection: a thread opens one, sends and reads.
    Connecting(
        &'env Single,
        thread::ScopedJoinHandle<'scope, Result<redis::Value, SendError>>,
    ),
    /// Settled before anything was read.
    Done(Result<redis::Value, Failed>),
}

impl Quorum {
    pub(super) fn new(masters: Vec<Arc<Backend>>, observer: Observer) -> Self {
        let addrs = masters
            .iter()
            .map(|m| m.addr().to_owned())
            .collect::<Vec<_>>()
            .join(", ");
        Quorum {
            observer,
            health: masters.iter().map(|_| Arc::default()).collect(),
            masters,
            parking: AtomicUsize::new(0),
            addrs,
        }
    }

    pub(super) fn addr(&self) -> &str {
        &self.addrs
    }

    pub(super) fn masters(&self) -> &[Arc<Backend>] {
        &self.masters
    }

    /// See [`Backend::send_to`].
    pub(super) fn send_to(
        &self,
        name: &str,
        packed: &[u8],
        timeout: Duration,
        only: Option<&[bool]>,
    ) -> Vec<Result<redis::Value, Failed>> {
        let until = Instant::now() + timeout;
        let mut left_out = self.left_out();
        if let Some(only) = only {
            for (left_out, included) in left_out.iter_mut().zip(only) {
                *left_out |= !included;
            }
        }
        let replies: Vec<Result<redis::Value, Failed>> = thread::scope(|scope| {
            let parts: Vec<Part<'_, '_>> = self
                .masters
                .iter()
                .zip(&left_out)
                .map(|(master, left_out)| {
                    if *left_out {
                        return Part::Done(Err(suspect_error(master)));
                    }
                    start(scope, master, name, packed, until)
                })
                .collect();
            // Every request is on its way: now read.
            parts
                .into_iter()
                .map(|part| match part {
                    Part::Sent(single, mut conn) => single
                        .finish(&mut conn, until)
                        .map_err(|err| single.failed(err, name)),
                    Part::Connecting(single, handle) => handle
                        .join()
                        .unwrap_or_else(|_| {
                            Err(SendError::NoConnection(Error::Unavailable {
                                addr: single.addr().to_owned(),
                                detail: "the thread sending to it panicked".to_owned(),
                            }))
                        })
                        .map_err(|err| single.failed(err, name)),
                    Part::Done(result) => result,
                })
                .collect()
        });
        for (index, reply) in replies.iter().enumerate() {
            if left_out[index] {
                continue;
            }
            match reply {
                Ok(_) => self.health[index].suspect.store(false, Ordering::Release),
                Err(failed) if failed.error.is_unreachable() => self.suspect(index, &failed.error),
                // An error reply (it answered), or nothing heard from it
                // (a busy pool): its probe, if any, decides.
                Err(_) => {}
            }
        }
        replies
    }

    /// See [`Backend::is_suspect`].
    pub(super) fn is_suspect(&self, index: usize) -> bool {
        self.health
            .get(index)
            .is_some_and(|health| health.suspect.load(Ordering::Acquire))
    }

    /// Which masters this round leaves out: the suspects, as long as the
    /// others make a majority; otherwise none (a round that cannot reach a
    /// majority without them must try them).
    fn left_out(&self) -> Vec<bool> {
        let suspects: Vec<bool> = self
            .health
            .iter()
            .map(|health| health.suspect.load(Ordering::Acquire))
            .collect();
        let answering = suspects.iter().filter(|suspect| !**suspect).count();
        // The majority, as the quorum lock counts it.
        if answering > self.masters.len() / 2 {
            suspects
        } else {
            vec![false; self.masters.len()]
        }
    }

    /// Marks master `index` suspect after `error`, and starts its probe
    /// unless one runs.
    fn suspect(&self, index: usize, error: &Error) {
        let health = &self.health[index];
        if !health.suspect.swap(true, Ordering::AcqRel) {
            log::warn!(
                "redbaton: Redlock master {} did not answer ({error}); left out of rounds while \
                 the others make a majority, until it answers again",
                self.masters[index].addr()
            );
            self.observer.emit(|| Event::MasterSuspect {
                master: self.masters[index].addr(),
            });
            // This process's waiters parked there would hear no baton
            // from it before it answers again (a stopped master keeps
            // their blocked call open): they look again now, and park on
            // a master that answers.
            if let Some(single) = single_of(&self.masters[index]) {
                single.send_waiters_away(error);
            }
        }
        // Set after `suspect`, cleared by the probe before it clears
        // `suspect`: a master marked suspect always has a probe, or is no
        // longer suspect.
        if health.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let master = Arc::downgrade(&self.masters[index]);
        let weak = Arc::downgrade(health);
        let probe = thread::Builder::new()
            .name("redbaton-probe".to_owned())
            .spawn({
                let observer = self.observer.clone();
                move || probe(&master, &weak, &observer)
            });
        if let Err(err) = probe {
            log::warn!(
                "redbaton: cannot start a thread to probe Redlock master {} ({err}); it is waited \
                 for in every round",
                self.masters[index].addr()
            );
            health.probing.store(false, Ordering::Release);
            health.suspect.store(false, Ordering::Release);
        }
    }

    /// See [`Backend::prefer_parking`].
    pub(super) fn prefer_parking(&self, master: Option<usize>) {
        let me = self as *const Quorum as usize;
        PREFERRED.with(|slot| slot.set(master.map(|index| (me, index))));
    }

    /// This thread's preferred master, if it is one of this quorum's and
    /// not suspect.
    fn preferred(&self) -> Option<usize> {
        let me = self as *const Quorum as usize;
        let (quorum, index) = PREFERRED.with(Cell::get)?;
        (quorum == me
            && index < self.masters.len()
            && !self.health[index].suspect.load(Ordering::Acquire))
        .then_some(index)
    }

    /// Wakes this client's waiters parked on `list` at any master.
    pub(super) fn wake_parked(&self, list: &str) -> bool {
        self.masters.iter().any(|master| master.wake_parked(list))
    }

    /// Parks on the master this thread's last round found the lock held on
    /// ([`Quorum::prefer_parking`]), else on the current parking master; a
    /// failure there moves waiters to the next one and counts as a wake-up.
    /// A suspect master is passed over at once: no baton reaches it
    /// (releases leave it out too).
    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        how: ParkHow<'_>,
    ) -> Result<Parked, Error> {
        // No master is swept for a quorum's waiters, and a quorum's
        // attempt takes no token (it goes to every master).
        let how = ParkHow {
            watch: None,
            claims: false,
            ..how
        };
        if let Some(index) = self.preferred() {
            return match self.masters[index].park(name, list, park, how) {
                Err(err) if err.is_transient() || err.is_timeout() => {
                    Ok(Parked::ConnectionFailed(err))
                }
                other => other,
            };
        }
        let current = self.parking.load(Ordering::Relaxed) % self.masters.len();
        let index = (0..self.masters.len())
            .map(|step| (current + step) % self.masters.len())
            .find(|index| !self.health[*index].suspect.load(Ordering::Acquire))
            .unwrap_or(current);
        if index != current {
            let _ =
                self.parking
                    .compare_exchange(current, index, Ordering::Relaxed, Ordering::Relaxed);
        }
        let moved_on = |err: Error| {
            let _ = self.parking.compare_exchange(
                index,
                (index + 1) % self.masters.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            Ok(Parked::ConnectionFailed(err))
        };
        match self.masters[index].park(name, list, park, how) {
            Ok(Parked::ConnectionFailed(err)) => moved_on(err),
            Err(err) if err.is_transient() || err.is_timeout() => moved_on(err),
            other => other,
        }
    }
}

/// Sends `packed` to `master` on an idle connection; without one, starts a
/// thread of `scope` that waits for a new connection (until `until`),
/// sends and reads, so that connections to all masters are opened at
/// once.
fn start<'scope, 'env>(
    scope: &'scope thread::Scope<'scope, 'env>,
    master: &'env Backend,
    name: &str,
    packed: &'env [u8],
    until: Instant,
) -> Part<'env, 'scope> {
    if let Err(error) = master.check_process() {
        return Part::Done(Err(Failed {
            error,
            outcome_unknown: false,
        }));
    }
    let Some(single) = single_of(master) else {
        return Part::Done(Err(not_single(master)));
    };
    match single.begin_idle(packed) {
        Some(Ok(conn)) => return Part::Sent(single, conn),
        Some(Err(err)) => return Part::Done(Err(single.failed(err, name))),
        None => {}
    }
    let connecting = thread::Builder::new()
        .name("redbaton-round".to_owned())
        .spawn_scoped(scope, move || {
            let mut conn = single.begin(packed, until)?;
            single.finish(&mut conn, until)
        });
    match connecting {
        Ok(handle) => Part::Connecting(single, handle),
        // No thread: wait here (this master's wait then delays reading the
        // others, never beyond `until`).
        Err(_) => match single.begin(packed, until) {
            Ok(conn) => Part::Sent(single, conn),
            Err(err) => Part::Done(Err(single.failed(err, name))),
        },
    }
}

/// The single server a quorum's master is.
fn single_of(master: &Backend) -> Option<&Single> {
    match &master.flavor {
        Flavor::Single(single) => Some(single),
        _ => None,
    }
}

fn not_single(master: &Backend) -> Failed {
    Failed {
        error: Error::WrongTopology {
            addr: master.addr().to_owned(),
            detail: "is not a single server".to_owned(),
        },
        outcome_unknown: false,
    }
}

/// The result of a suspect master left out of a round: nothing was sent.
fn suspect_error(master: &Backend) -> Failed {
    Failed {
        error: Error::Unreachable {
            addr: master.addr().to_owned(),
            detail: "did not answer lately; left out of this round until it answers a probe"
                .to_owned(),
            timed_out: false,
            source: None,
        },
        outcome_unknown: false,
    }
}

/// Pings `master` until it answers, resting longer after each failure,
/// then clears its suspicion; ends early when the client is gone.
fn probe(master: &Weak<Backend>, health: &Weak<Health>, observer: &Observer) {
    let mut rest = PROBE_REST;
    loop {
        let (Some(master), Some(health)) = (master.upgrade(), health.upgrade()) else {
            return;
        };
        // A refusal is an answer too (an ACL without `PING`, as the
        // documented one): the master is there.
        let answered = matches!(
            master.exchange("", "", |c| redis::cmd("PING").query::<()>(c)),
            Ok(_)
                | Err(Failed {
                    error: Error::PermissionDenied { .. },
                    ..
                })
        );
        if answered {
            health.probing.store(false, Ordering::Release);
            health.suspect.store(false, Ordering::Release);
            log::info!(
                "redbaton: Redlock master {} answers again; back in every round",
                master.addr()
            );
            observer.emit(|| Event::MasterBack {
                master: master.addr(),
            });
            return;
        }
        // Not while resting: the client may go meanwhile.
        drop((master, health));
        thread::sleep(rest);
        rest = (rest * 2).min(PROBE_REST_MAX);
    }
}

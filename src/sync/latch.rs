//! [`CountDownLatch`]: a count in Redis that threads of every process wait
//! on until it reaches zero.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::config::ReplicaAcks;
use crate::context::Context;
use crate::error::Error;
use crate::keys::LatchKeys;
use crate::lease::{confirm, Cleanup};
use crate::parking::{Attempt, Waited};
use crate::scripts::latch::{self as calls, CountDownArgs, Look};
use crate::scripts::Call;

/// The largest count a latch takes: Redis's Lua counts in doubles, exact
/// up to 2^53.
const MAX_COUNT: u64 = 1 << 53;

/// How long the id of a round that ended is kept: far longer than any
/// resend of the `try_set_count` that started it, which then recognises
/// its round instead of starting another.
const ENDED_ROUND_KEPT: Duration = Duration::from_secs(300);

/// How long a count-down the replicas did not confirm is sent again in
/// the background, at least: a count-down has no lease that would end its
/// effect, and a lost one keeps the round shut for good, so it outlasts a
/// failover (the sentinels' down-after, election and promotion: seconds
/// to tens of seconds), not only the client's default lease.
const COUNT_DOWN_RESENT_FOR: Duration = Duration::from_secs(60);

/// A handle on one distributed count-down latch, made by
/// [`Client::count_down_latch`](crate::Client::count_down_latch).
///
/// A round starts with [`try_set_count`](CountDownLatch::try_set_count)`(n)`;
/// every [`count_down`](CountDownLatch::count_down) takes one off; when the
/// count reaches zero, every waiter of every process is released, and the
/// latch is open until a new round starts. A latch nobody set is open.
///
/// Waiting costs no polling: one thread per process parks in `BLPOP` on the
/// round's baton list, the count-down that reaches zero pushes a token, and
/// each woken process passes it on before it leaves, so that every parked
/// process wakes in turn (a waiter that arrives just as the count hits zero
/// finds either the zero or the token). A waiter is released once its
/// round has ended, even when the next round has started by the time it
/// looks. Parks are bounded by the client's maximum park time, so even a
/// lost token delays a waiter by that much at most.
///
/// Cheap to clone, `Send + Sync`: hand clones to threads.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::open("redis://127.0.0.1/")?;
/// let ready = client.count_down_latch("nightly:workers-ready")?;
/// ready.try_set_count(3)?; // by the coordinator, before starting workers
///
/// // in each of three workers, on any machine:
/// ready.count_down()?;
///
/// // in the coordinator: blocks until all three have counted down
/// ready.wait()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CountDownLatch {
    context: Arc<Context>,
    keys: Arc<LatchKeys>,
}

impl CountDownLatch {
    pub(crate) fn new(context: Arc<Context>, keys: LatchKeys) -> CountDownLatch {
        CountDownLatch {
            context,
            keys: Arc::new(keys),
        }
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Starts a round at `count`, unless the current round is still
    /// counting (its count is above zero): returns whether this call set
    /// it. One script call; sent twice (its connection dropped), it starts
    /// one round and says `true`.
    ///
    /// # Errors
    /// [`Error::InvalidCount`] for 0 or more than 2^53; Redis failures;
    /// [`Error::WrongType`] when something else is stored under the
    /// latch's key.
    pub fn try_set_count(&self, count: u64) -> Result<bool, Error> {
        if count == 0 || count > MAX_COUNT {
            return Err(Error::InvalidCount { count });
        }
        let round = self.request_id();
        let call = calls::set_count(&self.keys, count, &round);
        self.context
            .backend
            .run(&self.keys.count, &self.keys.name, |c| call.invoke(c))
    }

    /// Counts one down in the round under way and returns the count left;
    /// the count reaching zero releases every waiter. A latch already open
    /// stays open (0). A count-down sent twice (its connection dropped
    /// before the reply) counts once, also when the next round has started
    /// in between: it counts only in the round it was meant for. Two script
    /// calls (a look at the round, then the count-down; one when open),
    /// and a `WAIT` under `replica_acks`.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the latch's key holds
    /// something else; [`Error::NotReplicated`] when the master counted it
    /// down but too few replicas confirmed it: do not count down again,
    /// the client sends this same count-down again in the background (it
    /// counts once) until the current master's replicas confirm it, for
    /// a minute or the client's default lease, whichever is longer, so
    /// that a failover does not lose it.
    pub fn count_down(&self) -> Result<u64, Error> {
        let Look::Counting { round } = self.look(None)? else {
            return Ok(0);
        };
        let context = &self.context;
        let id = self.request_id();
        let call = calls::count_down(
            &self.keys,
            CountDownArgs {
                id: &id,
                round: &round,
                baton_ttl: context.config.baton_ttl,
                ended_round_kept: ENDED_ROUND_KEPT,
            },
        );
        let acks = context.config.replica_acks;
        let sent = Instant::now();
        match send_count_down(&context.backend, &self.keys, acks, &call) {
            Err(err @ Error::NotReplicated { .. }) => {
                let (backend, keys) = (Arc::clone(&context.backend), Arc::clone(&self.keys));
                let resent_for = context.config.default_lease.max(COUNT_DOWN_RESENT_FOR);
                let cleanup = Cleanup::new(&self.keys.name, sent, resent_for, move || {
                    send_count_down(&backend, &keys, acks, &call).map(drop)
                });
                context.finish_later(cleanup);
                Err(err)
            }
            counted => counted,
        }
    }

    /// An id no other call of any client uses: `<client instance>:<n>`.
    fn request_id(&self) -> String {
        let context = &self.context;
        format!(
            "{}:{}",
            context.identities.instance(),
            context.next_request()
        )
    }

    /// The count now (0 when open). One `GET`; the answer may be stale by
    /// the time it arrives.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the latch's key holds
    /// something else.
    pub fn count(&self) -> Result<u64, Error> {
        let stored: Option<String> =
            self.context
                .backend
                .run(&self.keys.count, &self.keys.name, |c| {
                    redis::cmd("GET").arg(&self.keys.count).query(c)
                })?;
        match stored {
            None => Ok(0),
            Some(text) => text.parse().map_err(|_| Error::WrongType {
                name: self.keys.name.clone(),
                detail: format!("latch key {} holds {text:?}, not a count", self.keys.count),
            }),
        }
    }

    /// Blocks until the latch is open (its count is zero).
    ///
    /// No deadline of its own, like `std::sync::Barrier::wait`: use
    /// [`wait_for`](CountDownLatch::wait_for) to bound it. A Redis outage is
    /// ridden out for the client's I/O timeout, then returned as an error,
    /// so it never hangs on a dead server.
    ///
    /// # Errors
    /// Redis failures; [`Error::WrongType`] when the latch's key holds
    /// something else.
    pub fn wait(&self) -> Result<(), Error> {
        while !self.wait_deadline(None)? {}
        Ok(())
    }

    /// Like [`wait`](CountDownLatch::wait), but gives up after `timeout`
    /// and returns whether the latch opened. A timeout too large to be a
    /// point in time means no deadline.
    ///
    /// # Errors
    /// As [`wait`](CountDownLatch::wait).
    pub fn wait_for(&self, timeout: Duration) -> Result<bool, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_until(deadline),
            None => self.wait().map(|()| true),
        }
    }

    /// Like [`wait`](CountDownLatch::wait), but gives up at `deadline` and
    /// returns whether the latch opened.
    ///
    /// # Errors
    /// As [`wait`](CountDownLatch::wait).
    pub fn wait_until(&self, deadline: Instant) -> Result<bool, Error> {
        self.wait_deadline(Some(deadline))
    }

    /// One look, then the wait loop on the round's baton until `deadline`.
    fn wait_deadline(&self, deadline: Option<Instant>) -> Result<bool, Error> {
        let Look::Counting { round } = self.look(None)? else {
            return Ok(true);
        };
        let waited = self.context.room.wait_until(
            &self.keys.name,
            &self.keys.baton(&round),
            None,
            (),
            deadline,
            // Attempts take no token: a look pops it for them.
            None,
            None,
            None,
            || {
                Ok(match self.look(Some(&round))? {
                    Look::Open => Attempt::Acquired(()),
                    // Nothing expires: wait for the token (or the maximum
                    // park time).
                    Look::Counting { .. } => Attempt::Held {
                        lease_left: None,
                        handing_over: false,
                        park_on: None,
                        passed_on: false,
                    },
                })
            },
        )?;
        Ok(!matches!(waited, Waited::TimedOut))
    }

    /// Whether the latch is open: a first look (`round` `None`: the count
    /// is zero), or the look of a waiter of `round` (that round has ended),
    /// which passes the round's token on to the next parked process.
    fn look(&self, round: Option<&str>) -> Result<Look, Error> {
        let call = calls::wait(&self.keys, round, self.context.config.baton_ttl);
        self.context
            .backend
            .run(&self.keys.count, &self.keys.name, |c| call.invoke(c))
    }
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &self.keys.name)
            .field("key", &self.keys.count)
            .finish_non_exhaustive()
    }
}

/// Sends count-down `call` of latch `keys`, confirmed under `acks`.
fn send_count_down(
    backend: &Backend,
    keys: &LatchKeys,
    acks: Option<ReplicaAcks>,
    call: &Call,
) -> Result<u64, Error> {
    confirm::exchange_confirmed(
        backend,
        &keys.count,
        &keys.name,
        acks,
        |_| true,
        |c| call.invoke(c),
    )
    .map(|sent| sent.value)
    .map_err(|failed| failed.error)
}

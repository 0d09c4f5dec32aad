//! Parking many waiters on two connections per server (issue 27): waiters
//! are woken by the server's invalidation messages (server-assisted
//! client-side caching, `CLIENT TRACKING`), not by a blocked call, so the
//! connections a client parks on do not grow with the number of names it
//! waits for, every waiter is woken by its own baton, and a wake-up costs
//! the same at ten names as at ten thousand.
//!
//! - **Two connections**: the *listener* is subscribed to
//!   `__redis__:invalidate`; the *tracker* has tracking on, redirected to
//!   the listener (`CLIENT TRACKING ON REDIRECT <id> NOLOOP`). Each read
//!   of a key by the tracker (`LLEN`) asks the server to tell the listener
//!   once when that key next changes.
//! - **A look at a key** is `LLEN k` then `LPOP k`, pipelined with the
//!   other keys to look at. The `LLEN` (a read) registers the key, so its
//!   next change is announced; a token that is there is popped for the
//!   key's oldest waiter, and that pop (the tracker's own write, not
//!   announced to it) unregisters the key again, so a key whose last
//!   waiter got its token is left alone; a key with waiters left is looked
//!   at again. A key is looked at when its first waiter comes (unless it
//!   is registered already) and each time its change is announced while it
//!   has waiters. So nothing is lost: a token pushed before the look is
//!   popped by it, one pushed after is announced, and an announcement that
//!   arrives while the look is on its way calls for another look (and,
//!   with or without waiters then, unregisters the key: it may have used
//!   the look's read up). A waiter whose attempt has just passed the
//!   tokens of its list on to other clients' waiters (a semaphore's) has
//!   its key's first look only read it: its own look, sent at once, would
//!   otherwise pop them before theirs, sent on the announcement; it pops
//!   at the key's next change.
//! - **Rung, not looked for**: a waiter whose attempt pops its token
//!   itself ([`ParkHow::claims`]: the locks', reads', writes' and
//!   semaphores' waiters) is woken at its key's announcement with no look,
//!   if it is the key's oldest waiter and no look at the key is on its way
//!   ([`Parked::Rang`]); a key left without waiters is not looked at
//!   again. The pop moves from the look into the attempt, so the
//!   hand-off waits for a round trip less, and nothing else changes: the
//!   token is the woken waiter's as the look's pop would have made it.
//! - **Cost**: one `LLEN` + `LPOP` per waited key when it is first waited
//!   on and per change of it; nothing while nothing changes. Time is
//!   local: a waiter's park ends by its own timer (a condition variable
//!   with a deadline), so it is precise without a command (a park that
//!   ends at the maximum park time lasts at least [`IMPRECISE_FLOOR`], as
//!   Redis's timer tick made it).
//! - **Nothing is taken for nobody**: only keys with waiters are looked
//!   at; a token popped for a key whose waiters left meanwhile goes back
//!   on its list (`RPUSH` of the same value, then `PEXPIRE` with the baton
//!   TTL, as the scripts push).
//! - **Failures** reach the waiters as a blocked call's did: when the
//!   listener's or the tracker's connection fails (an idle tracker sends
//!   a `PING` every `sweep_every`, at least a second apart, to find out,
//!   and to stay clear of the server's idle `timeout`), announcements may have been lost, so the park of every waiter ends with
//!   [`Parked::ConnectionFailed`]; they look again and park anew, and the
//!   links are opened again. A `READONLY` (a master demoted under the
//!   tracker) does the same, so that Sentinel looks the master up afresh.
//!   A `WRONGTYPE` names a key that holds something else: its waiters get
//!   [`Error::WrongType`]; the others park on.
//! - **Refused**: a server or an ACL that refuses tracking, the
//!   subscription or the looks (`NOPERM`, an unknown command) turns the
//!   hub off for good, with one warning; [`Hub::park`] then says so, and
//!   the server parks each waiter in `BLPOP` on a parking connection of
//!   its own, as a Cluster does.
//! - **Watched parks**: a waiter may name a *watch key* whose absence
//!   means its object is free (a plain lock's hash). A sweeper thread
//!   checks every watched key every `sweep_every` (the client's
//!   `max_park`) with one `EXISTS k1 … kn` per thousand keys (on a
//!   Cluster node, per slot's keys, pipelined; a key whose slot moved
//!   counts as gone, so that its waiter looks again), and wakes
//!   the waiters whose key is gone (a second, pipelined `EXISTS` per key
//!   tells which, only then). So a wake-up that no baton brings (a baton
//!   popped by a process that died before using it, a key deleted or
//!   evicted) is still noticed within `max_park`, while the waiters
//!   themselves look only when their holder's lease ends or at a long
//!   backstop. A sweep that fails ends the park of every watched waiter,
//!   who looks again.
//!
//! Used for one server, Sentinel's master, each master of a Redlock
//! quorum and each node of a Redis Cluster (for the keys of the slots it
//! serves). A look that meets `MOVED` or `ASK` ends the park of the key's
//! waiters with the redirection, for the Cluster to follow. A key whose
//! empty list moves with its slot is not announced here again (nor one
//! filled on the importing node while its slot migrates): so a Cluster
//! node's tracker asks which slots its node serves and migrates (its own
//! line of `CLUSTER NODES`) every `SLOT_CHECK` while anyone waits there,
//! and sends the waiters of a slot that moved away, or started to
//! migrate, to look again (at the new owner, or the importing node).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redis::{RedisResult, Value};

use super::classify::{
    self, breaks_connection, describe_io, is_permission_failure, is_redirection, ScriptTracer,
};
use super::give_backs::GiveBacks;
use super::grants::Granted;
use super::pool::{Pool, PooledConn};
use super::{GrantReceipt, Grants, NodeParked, ParkHow, Parked};
use crate::error::Error;

/// The connections the hub of one server keeps: the listener and the
/// tracker.
pub(super) const LINKS: u32 = 2;

/// The channel the server announces changed keys on, to a redirect
/// client in RESP2.
const CHANNEL: &str = "__redis__:invalidate";

/// How long the listener waits for an announcement before it looks
/// whether the hub is gone: what a dropped client's listener thread
/// outlives it by.
const LISTEN_SLICE: Duration = Duration::from_millis(200);

/// The most keys one pipelined look carries.
const BATCH: usize = 512;

/// How long the links stay down after a failure before they are opened
/// again (the waiters look again meanwhile, by their own attempts).
const RELINK_PAUSE: Duration = Duration::from_millis(50);

/// Keys registered with the server but waited on by nobody, beyond which
/// the tracker starts afresh (a new connection: the server forgets what
/// the old one read), so that a long-lived client waiting on ever new
/// names keeps a bounded set.
const STALE_TRACKED: usize = 65_536;

/// How often a Cluster node's tracker asks which slots its node serves
/// and migrates, while anyone waits there: a waited list whose slot moved
/// away while empty is never announced here again (nor one filled on the
/// importing node while its slot migrates), so its waiters are sent to
/// look (and find the new owner, or the importing node) within this, not
/// at their park's end.
#[cfg(feature = "cluster")]
const SLOT_CHECK: Duration = Duration::from_millis(250);

/// The least time between two checks that an idle tracker is still
/// there, whatever the maximum park time.
const IDLE_CHECK_FLOOR: Duration = Duration::from_secs(1);

/// The least a park that ends at the maximum park time (not at a deadline
/// or a lease end) lasts: the server's timer tick (`hz` 10) made it so
/// when parks ended on Redis's timeout, and a tiny maximum park would
/// otherwise send a waiter's attempts as fast as the round trips go.
const IMPRECISE_FLOOR: Duration = Duration::from_millis(100);

/// How many given-back grants' tickets a hub keeps (see
/// `State::given_back`): a waiter parks within a moment of its attempt's
/// reply, while grants come at most one per release.
const GIVEN_BACK_KEPT: usize = 64;

/// The names of the hub's threads, as seen in debuggers and `/proc`.
const LISTENER_NAME: &str = "redbaton-listen";
const TRACKER_NAME: &str = "redbaton-track";
const SWEEPER_NAME: &str = "redbaton-sweep";

/// The most watch keys one `EXISTS` carries.
const SWEEP_CHUNK: usize = 1_000;

/// The parking hub of one server.
pub(super) struct Hub {
    inner: Arc<Inner>,
}

/// What the hub's threads share with the waiters.
struct Inner {
    state: Mutex<State>,
    /// The tracker sleeps on it while there is nothing to look at.
    tracker: Condvar,
    /// The listener sleeps on it while it has no link and nobody waits.
    listener: Condvar,
    /// The sweeper sleeps on it between sweeps, and while nobody watches.
    sweeper: Condvar,
    /// How often watched keys are checked.
    sweep_every: Duration,
    /// The server is a node of a Redis Cluster: the tracker checks which
    /// slots it serves every `SLOT_CHECK`.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    cluster_node: bool,
    /// Where the listener's and the tracker's connections come from.
    links: Pool,
    /// Where sweeps and given-back tokens go.
    commands: Pool,
    baton_ttl: Duration,
    io_timeout: Duration,
    trace: ScriptTracer,
    /// The client's grant channel, which the listener subscribes to as
    /// well (see `grants`), where this server's releases may grant.
    grants: Option<Arc<Grants>>,
    /// Where the grants that no parked waiter took are given back (with
    /// `grants`).
    give_backs: Option<GiveBacks>,
}

#[derive(Default)]
struct State {
    /// The waiters of each key waited on now, oldest first.
    keys: HashMap<String, VecDeque<Waiter>>,
    /// What each waiter's park came to, by waiter id, until it reads it.
    outcomes: HashMap<u64, Outcome>,
    next_id: u64,
    closed: bool,
    /// The listener's connection id, while it is subscribed.
    listener_id: Option<i64>,
    /// Counts the listener's subscriptions: what the tracker registered
    /// under an earlier one is announced to nobody.
    link: u64,
    /// Keys the server will announce the next change of (read since
    /// their last announcement, under the current link).
    tracked: HashSet<String>,
    /// Keys to look at.
    dirty: HashSet<String>,
    /// Keys of `dirty` whose look only reads (registers) the key: their
    /// waiter has just passed the tokens there on to other clients'
    /// waiters (see [`ParkHow::after_change`]), and takes one only after
    /// the key's next change.
    read_only: HashSet<String>,
    /// Keys whose read-only look is on its way.
    reading: HashSet<String>,
    /// Keys whose look is on its way, and whether their change was
    /// announced meanwhile. Such an announcement may have used up the
    /// look's own registration (the change came after the look's read), so
    /// a key announced under its look is not taken as registered, whether
    /// or not anyone waits for it when the announcement comes.
    looking: HashMap<String, bool>,
    /// Tracking was refused: waiters park elsewhere.
    refused: bool,
    /// The grant channel was refused: no grant comes here.
    grants_refused: bool,
    /// The tickets of the latest grants that found no waiter parked
    /// (given back), newest last, at most [`GIVEN_BACK_KEPT`]: a waiter
    /// whose grant came between its attempt's reply and its park parks
    /// with that ticket, and must look again at once rather than wait a
    /// whole park for a grant that is gone (its place among the waiters
    /// went with it).
    given_back: VecDeque<Box<str>>,
    /// The listener's and the tracker's threads run.
    linking: bool,
    /// The sweeper thread runs.
    sweeping: bool,
    /// The sweeper thread could not be started: watched parks last at
    /// most `sweep_every`, as unwatched ones.
    sweeper_failed: bool,
}

struct Waiter {
    id: u64,
    /// The object waited for, for messages.
    name: Arc<str>,
    wake: Arc<Condvar>,
    /// A key whose absence means the object is free, if the waiter gave
    /// one: the sweeper wakes the waiter when it is gone.
    watch: Option<Arc<str>>,
    /// Its next attempt takes the token itself ([`ParkHow::claims`]): an
    /// announcement of the key ends its park with no look.
    claims: bool,
    /// What a grant for it names ([`ParkHow::ticket`]), where grants
    /// come.
    ticket: Option<Box<str>>,
}

enum Outcome {
    /// A token came (or the hub closed, or turned off).
    Woken,
    /// The key changed: the waiter's attempt takes the token, if any.
    Rang,
    /// A link failed: look again.
    ConnectionFailed(Error),
    /// The key cannot be waited on (it holds something else).
    Refused(Error),
    /// `MOVED` or `ASK`: a Cluster's other node serves the key.
    Redirected(redis::RedisError),
    /// A release granted the waiter what it waits for, under this token.
    Granted(GrantReceipt),
}

/// What one key's look found.
enum Looked {
    /// Popped a token (or not), and the list held this many more.
    Found(Option<Vec<u8>>, i64),
    /// The server answered with an error.
    Failed(redis::RedisError),
}

impl Hub {
    /// A hub parking on connections of `links` (it keeps [`LINKS`] of
    /// them), giving tokens back and sweeping through `commands`,
    /// checking watched keys every `sweep_every`; a `cluster_node`'s
    /// checks the slots it serves too. `grants`: the client's grant
    /// channel, where this server's releases may grant.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        links: Pool,
        commands: Pool,
        baton_ttl: Duration,
        io_timeout: Duration,
        sweep_every: Duration,
        cluster_node: bool,
        trace: ScriptTracer,
        grants: Option<Arc<Grants>>,
    ) -> Hub {
        let give_backs = grants
            .as_ref()
            .map(|grants| GiveBacks::new(commands.clone(), Arc::clone(grants), io_timeout, trace));
        Hub {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                tracker: Condvar::new(),
                listener: Condvar::new(),
                sweeper: Condvar::new(),
                sweep_every,
                cluster_node,
                links,
                commands,
                baton_ttl,
                io_timeout,
                trace,
                grants,
                give_backs,
            }),
        }
    }

    /// Ends the park of every waiter, who looks again (as when a link
    /// fails), for `error`: the server stopped answering elsewhere, and a
    /// baton from it may not come for a long while.
    #[cfg(feature = "redlock")]
    pub(super) fn send_waiters_away(&self, error: &Error) {
        let mut state = self.inner.state.lock();
        state.end_all(|_| Outcome::ConnectionFailed(error.clone()));
    }

    /// Whether a release's grant may reach a waiter parked here: this
    /// client has a grant channel, and the server has refused neither
    /// tracking (waiters would park in `BLPOP`, where no grant reaches
    /// them) nor the channel. Before the first park, not yet known: yes.
    pub(super) fn takes_grants(&self) -> bool {
        let state = self.inner.state.lock();
        self.inner.grants.is_some() && !state.refused && !state.grants_refused
    }

    /// Ends the park of this client's waiters of `list` as a token would
    /// (they look again); whether any was parked. No command: a releaser
    /// whose next waiter is a thread of its own process wakes it so.
    pub(super) fn wake(&self, list: &str) -> bool {
        let mut state = self.inner.state.lock();
        if !state.keys.contains_key(list) {
            return false;
        }
        state.end_key(list, |_| Outcome::Woken);
        true
    }

    /// Parks the calling thread until a token of `list` comes to it, or
    /// `park` has passed (at least [`IMPRECISE_FLOOR`] unless `precise`),
    /// or a link it relies on fails, or (with a `watch` key) a sweep finds
    /// `watch` gone. With `after_change`, the key's first look only
    /// registers it, leaving its tokens to other clients. `None`: the
    /// server refused tracking, so this hub parks nobody; park another way.
    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        how: ParkHow<'_>,
    ) -> Result<Option<NodeParked>, Error> {
        let ParkHow {
            precise,
            watch,
            after_change,
            claims,
            ticket,
        } = how;
        let inner = &self.inner;
        let mut park = if precise {
            park
        } else {
            park.max(IMPRECISE_FLOOR)
        };
        let wake = Arc::new(Condvar::new());
        let mut state = inner.state.lock();
        if state.refused {
            return Ok(None);
        }
        if state.closed {
            return Ok(Some(NodeParked::Parked(Parked::Done)));
        }
        if watch.is_some() {
            if !state.sweeping && !state.sweeper_failed {
                match inner.start(SWEEPER_NAME, Inner::sweep) {
                    Ok(()) => state.sweeping = true,
                    Err(err) => {
                        log::warn!(
                            "redbaton: cannot start the parking sweeper ({err}); waiters look \
                             again every park"
                        );
                        state.sweeper_failed = true;
                    }
                }
            } else if state.sweeping {
                // It may sleep for want of watched waiters.
                inner.sweeper.notify_one();
            }
            if state.sweeper_failed {
                park = park.min(inner.sweep_every.max(IMPRECISE_FLOOR));
            }
        }
        if let Some(ticket) = ticket.filter(|_| inner.grants.is_some()) {
            if state.forget_given_back(ticket) {
                return Ok(Some(NodeParked::Parked(Parked::Done)));
            }
        }
        let until = Instant::now() + park;
        if !state.linking {
            let started = inner
                .start(LISTENER_NAME, Inner::listen)
                .and_then(|()| inner.start(TRACKER_NAME, Inner::track));
            if let Err(err) = started {
                log::warn!(
                    "redbaton: cannot start a parking thread ({err}); waiters look again every park"
                );
                drop(state);
                thread::sleep(until.saturating_duration_since(Instant::now()));
                return Ok(Some(NodeParked::Parked(Parked::Done)));
            }
            state.linking = true;
        }
        let id = state.next_id;
        state.next_id += 1;
        if state.keys.is_empty() && inner.cluster_node {
            // The first waiter: the tracker's slot checks start.
            inner.tracker.notify_one();
        }
        state
            .keys
            .entry(list.to_owned())
            .or_default()
            .push_back(Waiter {
                id,
                name: name.into(),
                wake: Arc::clone(&wake),
                watch: watch.map(Arc::from),
                claims,
                ticket: ticket.filter(|_| inner.grants.is_some()).map(Box::from),
            });
        if !state.tracked.contains(list) {
            let fresh = state.dirty.insert(list.to_owned());
            // A look already due for another waiter of the key pops as it
            // would have.
            if after_change && fresh {
                state.read_only.insert(list.to_owned());
            } else if !after_change {
                state.read_only.remove(list);
            }
            if fresh {
                inner.tracker.notify_one();
            }
        }
        if state.listener_id.is_none() {
            inner.listener.notify_one();
        }
        loop {
            if let Some(outcome) = state.outcomes.remove(&id) {
                return outcome.into_parked().map(Some);
            }
            if wake.wait_until(&mut state, until).timed_out() {
                return state
                    .leave(list, id)
                    .map_or(Ok(Some(NodeParked::Parked(Parked::Done))), |outcome| {
                        outcome.into_parked().map(Some)
                    });
            }
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        state.closed = true;
        self.inner.sweeper.notify_one();
        self.inner.tracker.notify_one();
        self.inner.listener.notify_one();
    }
}

impl Outcome {
    /// The park's result as the caller sees it; `Err` when the key cannot
    /// be waited on.
    fn into_parked(self) -> Result<NodeParked, Error> {
        match self {
            Outcome::Woken => Ok(NodeParked::Parked(Parked::Done)),
            Outcome::Rang => Ok(NodeParked::Parked(Parked::Rang)),
            Outcome::ConnectionFailed(err) => Ok(NodeParked::Parked(Parked::ConnectionFailed(err))),
            Outcome::Refused(err) => Err(err),
            Outcome::Redirected(err) => Ok(NodeParked::Redirected(err)),
            Outcome::Granted(receipt) => Ok(NodeParked::Parked(Parked::Granted(receipt))),
        }
    }
}

impl State {
    /// Takes waiter `id` of `list` out (its park ended by its own timer),
    /// unless an outcome came first.
    fn leave(&mut self, list: &str, id: u64) -> Option<Outcome> {
        if let Some(outcome) = self.outcomes.remove(&id) {
            return Some(outcome);
        }
        if let Some(waiters) = self.keys.get_mut(list) {
            waiters.retain(|waiter| waiter.id != id);
            if waiters.is_empty() {
                self.keys.remove(list);
            }
        }
        None
    }

    /// Ends the park of every waiter of `key` with what `outcome` makes of
    /// its object's name.
    fn end_key(&mut self, key: &str, mut outcome: impl FnMut(&str) -> Outcome) {
        for waiter in self.keys.remove(key).into_iter().flatten() {
            self.outcomes.insert(waiter.id, outcome(&waiter.name));
            waiter.wake.notify_one();
        }
    }

    /// Ends the park of every waiter.
    fn end_all(&mut self, mut outcome: impl FnMut(&str) -> Outcome) {
        for (_, waiters) in self.keys.drain() {
            for waiter in waiters {
                self.outcomes.insert(waiter.id, outcome(&waiter.name));
                waiter.wake.notify_one();
            }
        }
    }

    /// The links are down (or were opened afresh): nothing registered
    /// before is announced; with `failed`, every waiter looks again.
    fn unlink(&mut self, failed: Option<&Error>) {
        self.listener_id = None;
        self.link += 1;
        self.tracked.clear();
        self.dirty.clear();
        self.read_only.clear();
        self.reading.clear();
        self.looking.clear();
        if let Some(error) = failed {
            self.end_all(|_| Outcome::ConnectionFailed(error.clone()));
        }
    }

    /// Tracking was refused: every waiter looks again, and parks another
    /// way from now on.
    fn refuse(&mut self, addr: &str, why: &str) {
        if !std::mem::replace(&mut self.refused, true) {
            log::warn!(
                "redbaton: Redis at {addr} refused parking by invalidation messages ({why}); \
                 each waiter \
                 parks on a connection of its own, up to parking_connections (allow CLIENT ID, \
                 CLIENT TRACKING, SUBSCRIBE to __redis__:invalidate, LPOP and LLEN: see \
                 docs/security.md)"
            );
        }
        self.unlink(None);
        self.end_all(|_| Outcome::Woken);
    }

    /// Notes that the grant for `ticket` found no waiter parked.
    fn remember_given_back(&mut self, ticket: &str) {
        if self.given_back.len() == GIVEN_BACK_KEPT {
            self.given_back.pop_front();
        }
        self.given_back.push_back(ticket.into());
    }

    /// Whether a grant for `ticket` found no waiter parked (once: the
    /// ticket is forgotten).
    fn forget_given_back(&mut self, ticket: &str) -> bool {
        let Some(at) = self.given_back.iter().position(|t| &**t == ticket) else {
            return false;
        };
        self.given_back.remove(at);
        true
    }

    /// Ends the park of the waiter `granted` names with its token;
    /// whether it was parked here.
    fn grant(&mut self, granted: &Granted) -> bool {
        let Some(waiters) = self.keys.get_mut(&granted.list) else {
            return false;
        };
        let named = |waiter: &Waiter| waiter.ticket.as_deref() == Some(granted.ticket.as_str());
        let Some(at) = waiters.iter().position(named) else {
            return false;
        };
        let Some(waiter) = waiters.remove(at) else {
            return false;
        };
        if waiters.is_empty() {
            self.keys.remove(&granted.list);
        }
        self.outcomes
            .insert(waiter.id, Outcome::Granted(granted.receipt()));
        waiter.wake.notify_one();
        true
    }

    /// The server announced `keys` changed (`None`: everything, a flush).
    fn announced(&mut self, keys: Option<Vec<String>>) {
        match keys {
            None => {
                self.tracked.clear();
                self.read_only.clear();
                self.looking
                    .values_mut()
                    .for_each(|announced| *announced = true);
                let waited: Vec<String> = self.keys.keys().cloned().collect();
                self.dirty.extend(waited);
            }
            Some(keys) => {
                for key in keys {
                    self.tracked.remove(&key);
                    // It changed: its next look may take a token.
                    self.read_only.remove(&key);
                    if let Some(announced) = self.looking.get_mut(&key) {
                        *announced = true;
                    } else if self.ring(&key) {
                        continue;
                    }
                    if self.keys.contains_key(&key) {
                        self.dirty.insert(key);
                    }
                }
            }
        }
    }

    /// Ends the park of `key`'s oldest waiter at its announcement when
    /// that waiter takes the token itself ([`ParkHow::claims`]): it
    /// attempts at once instead of after a look. Whether the key has no
    /// waiter left (nothing to look at). Not while a look at the key is on
    /// its way: that look may pop the token, and hands it on as usual.
    fn ring(&mut self, key: &str) -> bool {
        let Some(waiters) = self.keys.get_mut(key) else {
            return false;
        };
        if !waiters.front().is_some_and(|waiter| waiter.claims) {
            return false;
        }
        let Some(waiter) = waiters.pop_front() else {
            return false;
        };
        self.outcomes.insert(waiter.id, Outcome::Rang);
        waiter.wake.notify_one();
        if waiters.is_empty() {
            self.keys.remove(key);
            return true;
        }
        false
    }

    /// Up to [`BATCH`] keys to look at, each with waiters (keys without
    /// any are dropped: nobody waits for their tokens).
    fn take_batch(&mut self) -> Vec<String> {
        let mut batch = Vec::new();
        let mut seen = Vec::new();
        for key in &self.dirty {
            if batch.len() == BATCH {
                break;
            }
            seen.push(key.clone());
            if self.keys.contains_key(key) {
                batch.push(key.clone());
            }
        }
        for key in &seen {
            self.dirty.remove(key);
            if self.read_only.remove(key) && self.keys.contains_key(key) {
                self.reading.insert(key.clone());
            }
        }
        for key in &batch {
            self.looking.insert(key.clone(), false);
        }
        batch
    }

    /// For each key of `batch` ([`State::take_batch`]'s), whether its look
    /// pops a token (else it only reads the key).
    fn pops(&self, batch: &[String]) -> Vec<bool> {
        batch
            .iter()
            .map(|key| !self.reading.contains(key))
            .collect()
    }

    /// What a look at `key` (sent under `link`) found: a `token` it
    /// popped, and `left` tokens after it. A token goes to the key's oldest
    /// waiter, or is returned to be given back when nobody waits any more;
    /// the key is looked at again while it has waiters and may hold
    /// tokens, and taken as registered only when the look's read still
    /// holds: under the same link, and with no announcement of the key
    /// since the look was sent (one may have used the read up).
    fn settle(
        &mut self,
        key: String,
        token: Option<Vec<u8>>,
        left: i64,
        link: u64,
    ) -> Option<(String, Vec<u8>)> {
        // Unknown (the links changed meanwhile): announced, to be safe.
        let announced = self.looking.remove(&key).unwrap_or(true);
        // A read-only look leaves the tokens it saw to others.
        let read_only = self.reading.remove(&key);
        let Some(token) = token else {
            if left > 0 && self.keys.contains_key(&key) && (!read_only || announced) {
                // A token came between the two reads.
                self.dirty.insert(key);
            } else if !announced && !self.dirty.contains(&key) && self.link == link {
                self.tracked.insert(key);
            }
            return None;
        };
        // Our own pop unregistered the key.
        self.tracked.remove(&key);
        let Some(waiter) = self.keys.get_mut(&key).and_then(VecDeque::pop_front) else {
            return Some((key, token));
        };
        self.outcomes.insert(waiter.id, Outcome::Woken);
        waiter.wake.notify_one();
        if self.keys.get(&key).is_some_and(VecDeque::is_empty) {
            self.keys.remove(&key);
        } else {
            self.dirty.insert(key);
        }
        None
    }

    /// Ends the park of the waiters of every key whose slot is not in
    /// `served` (a Cluster node's slot ranges) or has just started to
    /// migrate away (`leaving`): they look again, and find the slot's new
    /// owner, or (for a key not here) the importing node. The server no
    /// longer announces a key whose slot moved, nor one whose empty list
    /// is filled on the importing node.
    #[cfg(feature = "cluster")]
    fn end_unserved(&mut self, served: &[(u16, u16)], leaving: &HashSet<u16>) {
        let moved: Vec<String> = self
            .keys
            .keys()
            .filter(|key| {
                let slot = super::slot::of(key);
                leaving.contains(&slot)
                    || !served
                        .iter()
                        .any(|(first, last)| (*first..=*last).contains(&slot))
            })
            .cloned()
            .collect();
        for key in moved {
            self.tracked.remove(&key);
            self.end_key(&key, |_| Outcome::Woken);
        }
    }

    /// Whether the server keeps many keys registered that nobody waits
    /// for.
    fn tracks_too_many(&self) -> bool {
        self.tracked.len() > STALE_TRACKED + self.keys.len()
    }

    /// The distinct watch keys of the waiters parked now.
    fn watched(&self) -> Vec<Arc<str>> {
        let mut seen = HashSet::new();
        self.keys
            .values()
            .flatten()
            .filter_map(|waiter| waiter.watch.clone())
            .filter(|watch| seen.insert(Arc::clone(watch)))
            .collect()
    }

    /// Ends the park of every waiter whose watch key is in `watches`, with
    /// what `outcome` makes of its object's name.
    fn end_watching(
        &mut self,
        watches: &HashSet<Arc<str>>,
        mut outcome: impl FnMut(&str) -> Outcome,
    ) {
        let outcomes = &mut self.outcomes;
        self.keys.retain(|_, waiters| {
            waiters.retain(|waiter| match &waiter.watch {
                Some(watch) if watches.contains(watch) => {
                    outcomes.insert(waiter.id, outcome(&waiter.name));
                    waiter.wake.notify_one();
                    false
                }
                _ => true,
            });
            !waiters.is_empty()
        });
    }
}

/// Why a link could not be opened.
enum LinkError {
    /// The server refused it (an ACL, a server without tracking): it will
    /// not go better.
    Refused(String),
    /// The transport failed, or no connection could be had.
    Failed(Error),
}

impl Inner {
    fn classify(&self, err: redis::RedisError, name: &str) -> Error {
        classify::from_redis(err, name, self.links.addr(), self.trace)
    }

    /// What a failure to open a link is: refused for good, or worth
    /// another try.
    fn link_error(&self, err: redis::RedisError) -> LinkError {
        let refused = !breaks_connection(&err)
            && !classify::is_transient_reply(err.code())
            && err.code() != Some("READONLY");
        if refused {
            LinkError::Refused(describe_io(&err))
        } else {
            LinkError::Failed(self.classify(err, "(parking)"))
        }
    }

    /// Starts one of the hub's threads.
    fn start(self: &Arc<Self>, name: &str, run: fn(&Inner)) -> std::io::Result<()> {
        let inner = Arc::clone(self);
        thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(&inner))
            .map(drop)
    }

    /// The listener's thread: subscribes a connection to the server's
    /// announcements and passes them on, until the hub is dropped. Opens
    /// its link when someone waits, and again after a failure.
    fn listen(&self) {
        loop {
            {
                let mut state = self.state.lock();
                while !state.closed && !state.refused && state.keys.is_empty() {
                    self.listener.wait(&mut state);
                }
                if state.closed || state.refused {
                    return;
                }
            }
            let mut conn = match self.links.get(self.io_timeout) {
                Ok(conn) => conn,
                Err(err) => {
                    log::debug!("redbaton: no parking listener connection: {err}");
                    self.relink_later(Some(&err));
                    continue;
                }
            };
            let Some(id) = conn.client_id() else {
                self.state
                    .lock()
                    .refuse(self.links.addr(), "CLIENT ID was refused");
                return;
            };
            let raw = conn.keep();
            let mut pubsub = raw.as_pubsub();
            let subscribed = pubsub
                .set_read_timeout(Some(self.io_timeout))
                .and_then(|()| pubsub.subscribe(CHANNEL))
                .and_then(|()| pubsub.set_read_timeout(Some(LISTEN_SLICE)));
            if let Err(err) = subscribed {
                match self.link_error(err) {
                    LinkError::Refused(why) => {
                        self.state.lock().refuse(self.links.addr(), &why);
                        return;
                    }
                    LinkError::Failed(err) => {
                        self.relink_later(Some(&err));
                        continue;
                    }
                }
            }
            // The grant channel apart: a server or an ACL that refuses it
            // leaves parking as it was, with no grants (a release whose
            // `PUBLISH` nobody hears opens its window instead).
            if let Some(grants) = &self.grants {
                if let Err(err) = pubsub.subscribe(grants.channel()) {
                    match self.link_error(err) {
                        LinkError::Refused(why) => {
                            if !std::mem::replace(&mut self.state.lock().grants_refused, true) {
                                log::warn!(
                                    "redbaton: Redis at {} refused the grant channel ({why}); \
                                     releases wake waiters instead (allow SUBSCRIBE and PUBLISH \
                                     on the prefix's grant channels: see docs/security.md)",
                                    self.links.addr()
                                );
                            }
                        }
                        LinkError::Failed(err) => {
                            self.relink_later(Some(&err));
                            continue;
                        }
                    }
                }
            }
            {
                let mut state = self.state.lock();
                state.unlink(None);
                state.listener_id = Some(id);
                // Everything waited on is looked at under the new link.
                let waited: Vec<String> = state.keys.keys().cloned().collect();
                state.dirty.extend(waited);
                self.tracker.notify_one();
            }
            loop {
                match pubsub.get_message() {
                    Ok(message) if message.get_channel_name() == CHANNEL => {
                        // Keys are bulk strings; a nil payload is a flush.
                        let keys = match message.get_payload::<Option<Vec<Vec<u8>>>>() {
                            Ok(keys) => keys.map(|keys| {
                                keys.into_iter()
                                    .map(|key| String::from_utf8_lossy(&key).into_owned())
                                    .collect()
                            }),
                            Err(_) => None,
                        };
                        let mut state = self.state.lock();
                        if state.closed {
                            return;
                        }
                        state.announced(keys);
                        if !state.dirty.is_empty() {
                            self.tracker.notify_one();
                        }
                    }
                    Ok(message) => {
                        if let Some(grants) = &self.grants {
                            if message.get_channel_name() == grants.channel() {
                                let payload = message.get_payload::<Vec<u8>>().unwrap_or_default();
                                if !self.granted(&payload) {
                                    self.leave_grants(grants, &mut pubsub);
                                    return;
                                }
                            }
                        }
                    }
                    Err(err) if err.is_timeout() => {
                        // Refused tracking (the tracker found out): the
                        // link goes, so that no grant is published to a
                        // client whose waiters park elsewhere.
                        let leaves = {
                            let state = self.state.lock();
                            state.closed || state.refused
                        };
                        if leaves {
                            if let Some(grants) = &self.grants {
                                self.leave_grants(grants, &mut pubsub);
                            }
                            return;
                        }
                    }
                    Err(err) => {
                        log::debug!(
                            "redbaton: the parking listener's connection failed ({}); waiters \
                             look again",
                            describe_io(&err)
                        );
                        let err = self.classify(err, "(parking)");
                        self.relink_later(Some(&err));
                        break;
                    }
                }
            }
        }
    }

    /// A grant came: the waiter it names ends its park with it, or, where
    /// none is parked, it is given back (by `give_backs`, off this
    /// thread: rare, one round trip; see `grants`). Whether the listener
    /// goes on: not once the hub is closed or refused tracking (its
    /// waiters then park in `BLPOP`, where no grant reaches them, and
    /// grants may come faster than the listener's read times out, where
    /// it looks too). One look at the state, so that the woken waiter does
    /// not wait for it.
    fn granted(&self, message: &[u8]) -> bool {
        let Some(granted) = Granted::parse(message) else {
            log::warn!("redbaton: a message on the grant channel that is no grant was ignored");
            return true;
        };
        let (taken, listens) = {
            let mut state = self.state.lock();
            let taken = state.grant(&granted);
            if !taken {
                state.remember_given_back(&granted.ticket);
            }
            (taken, !state.closed && !state.refused)
        };
        if !taken {
            if let Some(give_backs) = &self.give_backs {
                give_backs.give_back(granted);
            }
        }
        listens
    }

    /// The listener leaves its link for good (the hub closed, or refused
    /// tracking): it unsubscribes from the grant channel and gives back
    /// every grant that came before the server's confirmation (grants come
    /// in order on the link; after it, a release's `PUBLISH` finds nobody
    /// and opens its window). A grant left unread would keep its lock for
    /// the grant's lease, and a waiter parked in `BLPOP` (a hub refused
    /// tracking after a grant was offered) would not hear of it until its
    /// park ended.
    fn leave_grants(&self, grants: &Grants, pubsub: &mut redis::PubSub<'_>) {
        if pubsub.unsubscribe(grants.channel()).is_err() {
            // The link failed: nothing more comes, and the releases that
            // hear nobody open their windows.
            return;
        }
        while let Ok(message) = pubsub.get_message() {
            if message.get_channel_name() == grants.channel() {
                let payload = message.get_payload::<Vec<u8>>().unwrap_or_default();
                self.granted(&payload);
            }
        }
    }

    /// The links are down: waiters look again (with `failed`), and the
    /// listener pauses before opening its link again.
    fn relink_later(&self, failed: Option<&Error>) {
        let mut state = self.state.lock();
        state.unlink(failed);
        let until = Instant::now() + RELINK_PAUSE;
        while !state.closed && !self.listener.wait_until(&mut state, until).timed_out() {}
    }

    /// The tracker's thread: looks at the keys that call for it, until the
    /// hub is dropped.
    fn track(&self) {
        // The connection with tracking on, and the link it is redirected
        // to.
        let mut conn: Option<(PooledConn, u64)> = None;
        #[cfg(feature = "cluster")]
        let mut next_slot_check = Instant::now() + SLOT_CHECK;
        // The slots the node was migrating away at the last check.
        #[cfg(feature = "cluster")]
        let mut migrating: HashSet<u16> = HashSet::new();
        // The server refused the checks (an ACL without `cluster|nodes`).
        #[cfg(feature = "cluster")]
        let mut checks_refused = false;
        let mut state = self.state.lock();
        loop {
            if state.closed || state.refused {
                return;
            }
            #[cfg(feature = "cluster")]
            if self.cluster_node
                && !checks_refused
                && !state.keys.is_empty()
                && Instant::now() >= next_slot_check
            {
                if let Some((tracking, tracking_link)) = &mut conn {
                    next_slot_check = Instant::now() + SLOT_CHECK;
                    let tracking_link = *tracking_link;
                    drop(state);
                    let own = self.own_slots(tracking);
                    state = self.state.lock();
                    match own {
                        Ok(own) => {
                            let now_migrating: HashSet<u16> = own.migrating.into_iter().collect();
                            let leaving = &now_migrating - &migrating;
                            state.end_unserved(&own.served, &leaving);
                            migrating = now_migrating;
                        }
                        // Refused (an ACL without `cluster|nodes`, a
                        // server that does not know it): the waiters of a
                        // slot that moves find it at their next look,
                        // within `max_park`.
                        Err(err)
                            if is_permission_failure(err.code(), err.detail().unwrap_or(""))
                                || err.code() == Some("ERR") =>
                        {
                            log::warn!(
                                "redbaton: Redis at {} refused CLUSTER NODES ({}); waiters of a \
                                 slot that moves find it at their next look, up to max_park \
                                 later (allow +cluster|nodes: see docs/security.md)",
                                self.links.addr(),
                                describe_io(&err)
                            );
                            checks_refused = true;
                        }
                        Err(err) => {
                            conn = None;
                            let err = self.classify(err, "(parking)");
                            if state.link == tracking_link {
                                state.unlink(Some(&err));
                            }
                        }
                    }
                    continue;
                }
            }
            let Some(listener) = state.listener_id else {
                conn = None;
                self.tracker.wait(&mut state);
                continue;
            };
            if conn.as_ref().is_some_and(|(_, link)| *link != state.link) || state.tracks_too_many()
            {
                // Registered under another link (or too many, long
                // stale): a fresh connection, so the server forgets them.
                conn = None;
                state.tracked.clear();
                let waited: Vec<String> = state.keys.keys().cloned().collect();
                state.dirty.extend(waited);
            }
            if state.dirty.is_empty() {
                let idle_since = Instant::now();
                #[allow(unused_mut)]
                let mut idle_until = idle_since + self.sweep_every.max(IDLE_CHECK_FLOOR);
                #[cfg(feature = "cluster")]
                if self.cluster_node && !checks_refused && !state.keys.is_empty() {
                    idle_until = idle_until.min(next_slot_check);
                }
                #[cfg(feature = "cluster")]
                let was_idle = state.keys.is_empty();
                let idle = self.tracker.wait_until(&mut state, idle_until).timed_out()
                    && idle_since.elapsed() >= IDLE_CHECK_FLOOR;
                // The slots are checked once waiters have been here a
                // while, not at the first look of each.
                #[cfg(feature = "cluster")]
                if was_idle {
                    next_slot_check = Instant::now() + SLOT_CHECK;
                }
                if let (true, Some((tracking, tracking_link))) =
                    (idle && state.dirty.is_empty(), &mut conn)
                {
                    // Nothing to look at for a while: is the tracker still
                    // there? Killed (by an operator, or the server's idle
                    // `timeout`), it would take its registrations with it
                    // and no announcement would come.
                    let tracking_link = *tracking_link;
                    drop(state);
                    let alive: RedisResult<()> = redis::cmd("PING").exec(tracking.keep());
                    state = self.state.lock();
                    if let Err(err) = alive {
                        let err = self.classify(err, "(parking)");
                        // A refusal is an answer: the tracker is there (an
                        // ACL without `PING`, as the documented one).
                        if !matches!(err, Error::PermissionDenied { .. }) {
                            conn = None;
                            if state.link == tracking_link {
                                state.unlink(Some(&err));
                            }
                        }
                    }
                }
                continue;
            }
            let link = state.link;
            if conn.is_none() {
                drop(state);
                let opened = self.open_tracking(listener);
                state = self.state.lock();
                match opened {
                    Ok(fresh) => conn = Some((fresh, link)),
                    Err(LinkError::Refused(why)) => {
                        state.refuse(self.links.addr(), &why);
                        return;
                    }
                    Err(LinkError::Failed(err)) => {
                        log::debug!("redbaton: cannot open the parking tracker: {err}");
                        if state.link == link {
                            state.unlink(Some(&err));
                        }
                        continue;
                    }
                }
                if state.link != link {
                    continue;
                }
            }
            let Some((mut tracking, tracking_link)) = conn.take() else {
                continue;
            };
            let batch = state.take_batch();
            if batch.is_empty() {
                conn = Some((tracking, tracking_link));
                continue;
            }
            let pops = state.pops(&batch);
            drop(state);
            let mut result = self.look(&mut tracking, &batch, &pops).map(|looked| {
                let given_back = self.found(&mut self.state.lock(), link, batch, looked);
                (!given_back.is_empty()).then_some(given_back)
            });
            if let Ok(Some(given_back)) = &result {
                result = self.give_back(&mut tracking, given_back).map(|()| None);
            }
            state = self.state.lock();
            match result {
                Ok(_) => conn = Some((tracking, tracking_link)),
                Err(err) => {
                    state.looking.clear();
                    log::debug!(
                        "redbaton: the parking tracker's connection failed ({}); waiters look \
                         again (a baton it was giving back is lost)",
                        describe_io(&err)
                    );
                    let err = self.classify(err, "(parking)");
                    if state.link == link {
                        state.unlink(Some(&err));
                    }
                }
            }
        }
    }

    /// The slot ranges the node `conn` is connected to serves, and the
    /// slots it is migrating away, by its own `CLUSTER NODES`.
    #[cfg(feature = "cluster")]
    fn own_slots(&self, conn: &mut PooledConn) -> RedisResult<super::slot::OwnSlots> {
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(conn.keep())?;
        super::slot::own_slots(&nodes).ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "CLUSTER NODES has no line of the node itself",
            ))
        })
    }

    /// A connection with tracking on, announcing to `listener`.
    fn open_tracking(&self, listener: i64) -> Result<PooledConn, LinkError> {
        let mut conn = self.links.get(self.io_timeout).map_err(LinkError::Failed)?;
        let on: RedisResult<()> = redis::cmd("CLIENT")
            .arg("TRACKING")
            .arg("ON")
            .arg("REDIRECT")
            .arg(listener)
            .arg("NOLOOP")
            .exec(conn.keep());
        on.map(|()| conn).map_err(|err| self.link_error(err))
    }

    /// Registers each key and pops a token of it: `LLEN k` (a read: the
    /// server announces the key's next change), then `LPOP k`, pipelined.
    /// A pop that takes a token is a write of the tracker's own, which
    /// unregisters the key without an announcement (`NOLOOP`): a key whose
    /// last waiter got its token is then registered no more; one whose
    /// list was empty stays registered. A key whose `pops` is false is only
    /// read (`LLEN`), and found with no token.
    fn look(
        &self,
        conn: &mut PooledConn,
        keys: &[String],
        pops: &[bool],
    ) -> RedisResult<Vec<Looked>> {
        let mut pipe = redis::pipe();
        for (key, pops) in keys.iter().zip(pops) {
            pipe.cmd("LLEN").arg(key);
            if *pops {
                pipe.cmd("LPOP").arg(key);
            }
        }
        let replies: Vec<Value> = pipe.ignore_errors().query(conn.keep())?;
        let mut replies = replies.into_iter();
        let mut looked = Vec::with_capacity(keys.len());
        for pops in pops {
            // A read-only look has no pop: it found no token.
            let (Some(length), Some(popped)) = (
                replies.next(),
                if *pops {
                    replies.next()
                } else {
                    Some(Value::Nil)
                },
            ) else {
                break;
            };
            looked.push(match (length, popped) {
                (Value::ServerError(err), _) | (_, Value::ServerError(err)) => {
                    Looked::Failed(err.into())
                }
                (Value::Int(length), Value::BulkString(token)) => {
                    Looked::Found(Some(token), length - 1)
                }
                (Value::Int(length), _) => Looked::Found(None, length),
                (other, _) => Looked::Failed(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "LLEN answered something else than a number",
                    format!("{other:?}"),
                ))),
            });
        }
        Ok(looked)
    }

    /// Hands what the look at `batch` found to the waiters; returns the
    /// tokens that nobody waits for any more, to give back.
    fn found(
        &self,
        state: &mut State,
        link: u64,
        batch: Vec<String>,
        looked: Vec<Looked>,
    ) -> Vec<(String, Vec<u8>)> {
        let mut given_back = Vec::new();
        for (key, looked) in batch.into_iter().zip(looked) {
            if matches!(looked, Looked::Failed(_)) {
                state.looking.remove(&key);
                state.reading.remove(&key);
            }
            match looked {
                Looked::Found(token, left) => {
                    given_back.extend(state.settle(key, token, left, link));
                }
                // A Cluster's slot served elsewhere: its waiters follow
                // the redirection (the key is not registered here).
                Looked::Failed(err) if is_redirection(&err) => {
                    state.end_key(&key, |_| Outcome::Redirected(err.clone()));
                }
                Looked::Failed(err) if err.code() == Some("WRONGTYPE") => {
                    state.end_key(&key, |name| Outcome::Refused(wrong_type(name)));
                }
                Looked::Failed(err)
                    if is_permission_failure(err.code(), err.detail().unwrap_or("")) =>
                {
                    state.refuse(self.links.addr(), &describe_io(&err));
                    return given_back;
                }
                Looked::Failed(err) => {
                    let transient =
                        classify::is_transient_reply(err.code()) || err.code() == Some("READONLY");
                    let error = self.classify(err, &key);
                    if transient {
                        // A master demoted under the tracker, or a server
                        // between two states: everyone looks again.
                        if state.link == link {
                            state.end_all(|_| Outcome::ConnectionFailed(error.clone()));
                        }
                        state.tracked.remove(&key);
                    } else {
                        state.end_key(&key, |_| Outcome::Refused(error.clone()));
                    }
                }
            }
        }
        given_back
    }

    /// Puts tokens nobody here waits for back on their lists, for someone
    /// else. A list holds tokens of one value, so their order does not
    /// matter.
    fn give_back(&self, conn: &mut PooledConn, tokens: &[(String, Vec<u8>)]) -> RedisResult<()> {
        let mut pipe = redis::pipe();
        for (key, token) in tokens {
            pipe.cmd("RPUSH")
                .arg(key)
                .arg(token)
                .ignore()
                .cmd("PEXPIRE")
                .arg(key)
                .arg(millis(self.baton_ttl))
                .ignore();
        }
        pipe.exec(conn.keep())
    }

    /// The sweeper's thread: every `sweep_every` while waiters watch keys,
    /// wakes those whose key is gone, until the hub is dropped.
    fn sweep(&self) {
        let mut state = self.state.lock();
        loop {
            // Sleeps while nobody watches (a watched park notifies).
            while !state.closed && state.watched().is_empty() {
                self.sweeper.wait(&mut state);
            }
            let next = Instant::now() + self.sweep_every;
            while !state.closed && !self.sweeper.wait_until(&mut state, next).timed_out() {}
            if state.closed {
                state.sweeping = false;
                return;
            }
            let watched = state.watched();
            if watched.is_empty() {
                continue;
            }
            drop(state);
            let absent = self.absent(&watched);
            state = self.state.lock();
            match absent {
                Ok(gone) if gone.is_empty() => {}
                Ok(gone) => {
                    let gone: HashSet<Arc<str>> = gone.into_iter().collect();
                    state.end_watching(&gone, |_| Outcome::Woken);
                }
                // Every command connection busy (waiters' attempts): the
                // server answers, so nothing is lost by sweeping next time;
                // waking every watched waiter would only add to the queue.
                Err(Error::PoolTimeout { .. }) => {
                    log::debug!("redbaton: no command connection for a parking sweep; next time");
                }
                Err(err) => {
                    log::debug!(
                        "redbaton: a parking sweep failed ({err}); watched waiters look again"
                    );
                    let all: HashSet<Arc<str>> = watched.into_iter().collect();
                    state.end_watching(&all, |_| Outcome::ConnectionFailed(err.clone()));
                }
            }
        }
    }

    /// Which of `watched` do not exist: one `EXISTS` over each group of
    /// keys (a chunk; on a Cluster node, one slot's keys of a chunk, as a
    /// multi-key command must stay within one slot), pipelined, and only
    /// where a group counts fewer than it has, one per key. On a Cluster
    /// node, keys whose slot is served elsewhere (`MOVED`, `ASK`) count as
    /// gone: their waiters look again, and follow the redirection.
    fn absent(&self, watched: &[Arc<str>]) -> Result<Vec<Arc<str>>, Error> {
        let groups = self.sweep_groups(watched);
        let mut conn = self.commands.get(self.io_timeout)?;
        let mut gone = Vec::new();
        for batch in groups.chunks(SWEEP_CHUNK) {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for group in batch {
                pipe.cmd("EXISTS")
                    .arg(group.iter().map(|key| &**key).collect::<Vec<_>>());
            }
            let counts = self.sweep_replies(&mut conn, &pipe, &batch[0][0])?;
            let mut each = Vec::new();
            for (group, count) in batch.iter().zip(counts) {
                match count {
                    Some(count) if count == group.len() as i64 => {}
                    Some(_) => each.extend(group.iter()),
                    None => gone.extend(group.iter().cloned()),
                }
            }
            if each.is_empty() {
                continue;
            }
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for key in &each {
                pipe.cmd("EXISTS").arg(&***key);
            }
            let counts = self.sweep_replies(&mut conn, &pipe, each[0])?;
            gone.extend(
                each.into_iter()
                    .zip(counts)
                    .filter(|(_, count)| *count != Some(1))
                    .map(|(key, _)| Arc::clone(key)),
            );
        }
        Ok(gone)
    }

    /// The groups of watched keys one `EXISTS` each counts: chunks of
    /// [`SWEEP_CHUNK`] keys, split by slot on a Cluster node.
    fn sweep_groups(&self, watched: &[Arc<str>]) -> Vec<Vec<Arc<str>>> {
        #[cfg(feature = "cluster")]
        if self.cluster_node {
            let mut by_slot: HashMap<u16, Vec<Arc<str>>> = HashMap::new();
            for key in watched {
                by_slot
                    .entry(super::slot::of(key))
                    .or_default()
                    .push(Arc::clone(key));
            }
            return by_slot
                .into_values()
                .flat_map(|keys| {
                    keys.chunks(SWEEP_CHUNK)
                        .map(<[Arc<str>]>::to_vec)
                        .collect::<Vec<_>>()
                })
                .collect();
        }
        watched
            .chunks(SWEEP_CHUNK)
            .map(<[Arc<str>]>::to_vec)
            .collect()
    }

    /// The counts a pipeline of `EXISTS` (errors ignored, so that each
    /// comes back as a reply) answered, in order; `None` for a Cluster
    /// node's redirection (the keys are served elsewhere). Any other error
    /// fails the sweep (`key`, for its message).
    fn sweep_replies(
        &self,
        conn: &mut PooledConn,
        pipe: &redis::Pipeline,
        key: &str,
    ) -> Result<Vec<Option<i64>>, Error> {
        let replies: RedisResult<Vec<Value>> = conn.run(|c| pipe.query(c));
        let replies = replies.map_err(|err| self.classify(err, key))?;
        replies
            .into_iter()
            .map(|reply| match reply {
                Value::Int(count) => Ok(Some(count)),
                Value::ServerError(err) => {
                    let err: redis::RedisError = err.into();
                    if is_redirection(&err) {
                        Ok(None)
                    } else {
                        Err(self.classify(err, key))
                    }
                }
                other => Err(self.classify(
                    redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "EXISTS answered something else than a number",
                        format!("{other:?}"),
                    )),
                    key,
                )),
            })
            .collect()
    }
}

/// The crate's error for a key that holds something else than a baton
/// list.
fn wrong_type(name: &str) -> Error {
    Error::WrongType {
        name: name.to_owned(),
        detail: "WRONGTYPE its baton key holds something else than a list".to_owned(),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "p:{k}:baton";

    /// A state with one waiter on [`KEY`], due for a look.
    fn a_waiter_due_for_a_look() -> State {
        let mut state = State::default();
        state
            .keys
            .entry(KEY.to_owned())
            .or_default()
            .push_back(Waiter {
                id: 7,
                name: "k".into(),
                wake: Arc::new(Condvar::new()),
                watch: None,
                claims: false,
                ticket: Some("c:1 5".into()),
            });
        state.dirty.insert(KEY.to_owned());
        state
    }

    #[test]
    fn a_given_back_grant_is_remembered_once_and_only_the_latest_are_kept() {
        let mut state = State::default();
        state.remember_given_back("c:1 5");
        assert!(!state.forget_given_back("c:1 4"));
        assert!(state.forget_given_back("c:1 5"));
        assert!(!state.forget_given_back("c:1 5"), "forgotten once told");
        for request in 0..=GIVEN_BACK_KEPT {
            state.remember_given_back(&format!("c:1 {request}"));
        }
        assert_eq!(state.given_back.len(), GIVEN_BACK_KEPT);
        assert!(!state.forget_given_back("c:1 0"), "the oldest went");
        assert!(state.forget_given_back(&format!("c:1 {GIVEN_BACK_KEPT}")));
    }

    #[test]
    fn a_grant_ends_the_park_of_the_waiter_it_names_alone() {
        let mut state = a_waiter_due_for_a_look();
        let message = |ticket: &str| format!("{ticket} 99 a:2,5; 7 p:{{k}}:l{KEY}");
        for other in ["c:1 4", "c:2 5"] {
            let granted = Granted::parse(message(other).as_bytes()).unwrap();
            assert!(!state.grant(&granted), "{other}");
        }
        assert!(state.outcomes.is_empty());
        let granted = Granted::parse(message("c:1 5").as_bytes()).unwrap();
        assert!(state.grant(&granted));
        assert!(matches!(
            state.outcomes.get(&7),
            Some(Outcome::Granted(GrantReceipt { token: 99, behind })) if &**behind == "a:2,5;"
        ));
        assert!(!state.keys.contains_key(KEY), "its key has no waiter left");
        assert!(!state.grant(&granted), "granted once");
    }

    /// A state with one waiter on [`KEY`], whose look has been sent.
    fn looking_with_a_waiter() -> State {
        let mut state = a_waiter_due_for_a_look();
        assert_eq!(state.take_batch(), [KEY]);
        state
    }

    #[test]
    fn an_empty_look_registers_the_key() {
        let mut state = looking_with_a_waiter();
        let link = state.link;
        assert!(state.settle(KEY.to_owned(), None, 0, link).is_none());
        assert!(state.tracked.contains(KEY));
        assert!(state.dirty.is_empty());
    }

    /// The waiter leaves, then the list changes after the look's read and
    /// the announcement comes before the look's answer: the announcement
    /// used the read up, so the key is not registered (taking it as
    /// registered, a later waiter would never look, and no announcement
    /// would come: a lost wake-up, seen in the multi-lock stress test).
    #[test]
    fn a_key_announced_while_its_look_is_on_its_way_is_not_taken_as_registered() {
        let mut state = looking_with_a_waiter();
        let link = state.link;
        assert!(state.leave(KEY, 7).is_none());
        state.announced(Some(vec![KEY.to_owned()]));
        assert!(state.settle(KEY.to_owned(), None, 0, link).is_none());
        assert!(!state.tracked.contains(KEY));
        // The same after a flush announcement.
        let mut state = looking_with_a_waiter();
        assert!(state.leave(KEY, 7).is_none());
        state.announced(None);
        assert!(state.settle(KEY.to_owned(), None, 0, link).is_none());
        assert!(!state.tracked.contains(KEY));
    }

    /// A waiter that passed the tokens on parks: the look only reads the
    /// key, leaves the tokens it saw (nothing is looked at again) and
    /// registers the key; its next change calls for a look that pops.
    #[test]
    fn a_read_only_look_leaves_the_tokens_and_registers_the_key() {
        let mut state = a_waiter_due_for_a_look();
        state.read_only.insert(KEY.to_owned());
        let batch = state.take_batch();
        assert_eq!(state.pops(&batch), [false]);
        let link = state.link;
        assert!(state.settle(KEY.to_owned(), None, 2, link).is_none());
        assert!(state.tracked.contains(KEY));
        assert!(state.dirty.is_empty() && state.outcomes.is_empty());
        state.announced(Some(vec![KEY.to_owned()]));
        let batch = state.take_batch();
        assert_eq!(state.pops(&batch), [true]);
        // Announced while the read was on its way: the tokens may be new.
        let mut state = looking_with_a_waiter();
        state.reading.insert(KEY.to_owned());
        state.announced(Some(vec![KEY.to_owned()]));
        assert!(state.settle(KEY.to_owned(), None, 1, link).is_none());
        assert!(state.dirty.contains(KEY) && !state.read_only.contains(KEY));
    }

    #[test]
    fn a_popped_token_goes_to_the_waiter_or_back() {
        let mut state = looking_with_a_waiter();
        let link = state.link;
        assert!(state
            .settle(KEY.to_owned(), Some(b"ok".to_vec()), 0, link)
            .is_none());
        assert!(matches!(state.outcomes.get(&7), Some(Outcome::Woken)));
        assert!(state.keys.is_empty() && !state.tracked.contains(KEY));
        let mut state = looking_with_a_waiter();
        assert!(state.leave(KEY, 7).is_none());
        let back = state.settle(KEY.to_owned(), Some(b"ok".to_vec()), 0, link);
        assert_eq!(back, Some((KEY.to_owned(), b"ok".to_vec())));
    }
}

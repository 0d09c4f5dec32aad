//! Parking many waiters on a few connections (issue 27): each parking
//! connection of a server (a *shard*, at most [`MAX_SHARDS`]) sits in one
//! `BLPOP k1 … kn ctl` over the baton lists of every key its waiters wait
//! on, and hands each popped token to the thread waiting for that key. So
//! the connections a client parks on do not grow with the number of names
//! it waits for, and every waiter is woken by its own baton.
//!
//! - **A new key**: a waiter whose key is not in its shard's blocked call
//!   pushes a token on the shard's *control list* (`ctl`, a key of its
//!   own under the client's prefix, named by a random id): the call
//!   returns with it and is issued again with the new key. A push is
//!   durable, so it cannot miss a call that has not reached the server
//!   yet (a `CLIENT UNBLOCK` could); at most one control token is under
//!   way per shard. A baton pushed while the call is being issued again
//!   stays in its list and is popped by the next call.
//! - **Time is local**: a waiter's park ends by its own timer (a condition
//!   variable with a deadline), never by a Redis timeout, so it is precise
//!   without a command (a park that ends at the maximum park time lasts
//!   at least [`IMPRECISE_FLOOR`], as Redis's timer tick made it). The
//!   blocked call's own timeout is only a backstop ([`BACKSTOP`], 20 s)
//!   for a server that went silent.
//! - **Cost**: each return of a call (a token, a control token) sends the
//!   shard's whole key list again, so a wake-up costs O(names waited on /
//!   shards) in bytes and server work; waiters joining meanwhile share
//!   one re-issue.
//! - **Nothing is lost**: a token popped for a key whose waiters all left
//!   goes to another local waiter of that key if one came, else back on
//!   its list (`RPUSH` of the same value, then `PEXPIRE` with the baton
//!   TTL, as the scripts push), and the key leaves the next call. A key
//!   whose waiter's park ended by its timer stays in the call for
//!   [`VACANT_GRACE`], so that a waiter looking at its lock between two
//!   parks does not cost a re-issue each time; a key whose waiter was
//!   woken by a token leaves the next call (that waiter most likely got
//!   its lock, and it comes back with a re-issue if not).
//! - **Failures** reach the waiters as before: a failed call (a killed
//!   connection, a master demoted under it) ends the park of every waiter
//!   of its shard with [`Parked::ConnectionFailed`]; they look again and,
//!   on Sentinel, the master is looked up afresh. A `WRONGTYPE` names the
//!   keys that hold something else (their waiters get
//!   [`Error::WrongType`]); the others park on.
//!
//! - **Watched parks**: a waiter may name a *watch key* whose absence
//!   means its object is free (a plain lock's hash). A sweeper thread
//!   checks every watched key every `sweep_every` (the client's
//!   `max_park`) with one `EXISTS k1 … kn` per thousand keys, and wakes
//!   the waiters whose key is gone (a second, pipelined `EXISTS` per key
//!   tells which, only then). So a wake-up that no baton brings (a baton
//!   popped by a process that died before using it, a key deleted or
//!   evicted) is still noticed within `max_park`, while the waiters
//!   themselves look only when their holder's lease ends or at a long
//!   backstop: the cost of waiting no longer grows with the number of
//!   waiters. A sweep that fails ends the park of every watched waiter,
//!   who looks again (as after a failed blocked call).
//!
//! Used for one server, Sentinel's master and each master of a Redlock
//! quorum; a Redis Cluster keeps one key per parked connection (a
//! multi-key `BLPOP` must stay within one slot).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redis::RedisResult;

use super::classify::{self, breaks_connection, describe_io, ScriptTracer};
use super::pool::{Pool, PooledConn};
use super::unblock::{Scheduled, Unblocker};
use super::Parked;
use crate::error::Error;

/// The most parking connections (and threads) one server's hub uses.
pub(super) const MAX_SHARDS: u32 = 4;

/// The blocked call's own timeout: it only ends a call that nothing else
/// ended (a silent server, a re-issue request that could not be sent).
/// Waiters do not rely on it (their own timers end their parks, and the
/// sweep finds a watched lock gone), so it is long: each return sends the
/// whole key list again, and one per 20 s per shard is what waiting costs
/// in `BLPOP`s.
const BACKSTOP: Duration = Duration::from_secs(20);

/// The backstop once a control push was refused (an ACL): names new to a
/// parked connection then join the call only when it returns.
const REFUSED_BACKSTOP: Duration = Duration::from_secs(2);

/// How long a key whose waiters left stays in the blocked call.
const VACANT_GRACE: Duration = Duration::from_millis(250);

/// The least a park that ends at the maximum park time (not at a deadline
/// or a lease end) lasts: the server's timer tick (`hz` 10) made it so
/// when parks ended on Redis's timeout, and a tiny maximum park would
/// otherwise send a waiter's attempts as fast as the round trips go.
const IMPRECISE_FLOOR: Duration = Duration::from_millis(100);

/// The value pushed on a control list.
const CONTROL_TOKEN: &str = "reissue";

/// How long an unpopped control token may stay (its parker died).
const CONTROL_TTL: Duration = Duration::from_secs(60);

/// The name of a shard's thread, as seen in debuggers and `/proc`.
const THREAD_NAME: &str = "redbaton-park";

/// The name of the sweeper's thread.
const SWEEPER_NAME: &str = "redbaton-sweep";

/// The most watch keys one `EXISTS` carries.
const SWEEP_CHUNK: usize = 1_000;

/// The parking hub of one server.
pub(super) struct Hub {
    inner: Arc<Inner>,
    /// Sends the `CLIENT UNBLOCK` that ends a blocked call when the hub
    /// goes.
    unblocker: Arc<Unblocker>,
}

/// What the shards' threads share with the waiters.
struct Inner {
    state: Mutex<State>,
    /// One per shard: its thread sleeps on it while it has no key.
    idle: Vec<Condvar>,
    /// The sweeper sleeps on it between sweeps, and while nobody watches.
    sweeper: Condvar,
    /// How often watched keys are checked.
    sweep_every: Duration,
    /// Where the shards' connections come from.
    parking: Pool,
    /// Where control tokens are pushed from.
    commands: Pool,
    /// The control list of each shard.
    control: Vec<String>,
    baton_ttl: Duration,
    io_timeout: Duration,
    trace: ScriptTracer,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Entry>,
    shards: Vec<Shard>,
    /// What each waiter's park came to, by waiter id, until it reads it.
    outcomes: HashMap<u64, Outcome>,
    next_id: u64,
    closed: bool,
    /// The unblocks that end the blocked calls when the hub goes.
    closing: Vec<Scheduled>,
    /// Set once a control push was refused (an ACL): new keys then wait
    /// for the backstop.
    control_refused: bool,
    /// The sweeper thread runs.
    sweeping: bool,
    /// The sweeper thread could not be started: watched parks last at
    /// most `sweep_every`, as unwatched ones.
    sweeper_failed: bool,
}

/// The waiters of one key.
#[derive(Default)]
struct Entry {
    waiters: VecDeque<Waiter>,
    /// When its last waiter left, while it has none.
    vacant_since: Option<Instant>,
    /// It leaves the next call (a token of it was given back, or its
    /// waiters were sent away), unless a waiter comes first.
    drop_next: bool,
}

struct Waiter {
    id: u64,
    /// The object waited for, for messages.
    name: Arc<str>,
    wake: Arc<Condvar>,
    /// A key whose absence means the object is free, if the waiter gave
    /// one: the sweeper wakes the waiter when it is gone.
    watch: Option<Arc<str>>,
}

#[derive(Default)]
struct Shard {
    /// Its thread runs.
    running: bool,
    /// It is in (or about to send) a blocked call over `blocked_on`.
    issued: bool,
    blocked_on: HashSet<String>,
    /// The server's id of its connection, while it has one.
    client_id: Option<i64>,
    /// A control token is under way (pushed, or being pushed, not popped).
    control_pending: bool,
}

enum Outcome {
    /// A token came (or the hub closed).
    Woken,
    /// The blocked call failed: look again.
    ConnectionFailed(Error),
    /// The key cannot be waited on (it holds something else).
    Refused(Error),
}

impl Hub {
    /// A hub parking on connections of `parking` (at most `shards` of
    /// them), pushing control tokens through `commands`, with control
    /// lists under `prefix`, checking watched keys every `sweep_every`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        parking: Pool,
        commands: Pool,
        unblocker: Arc<Unblocker>,
        prefix: &str,
        shards: u32,
        baton_ttl: Duration,
        io_timeout: Duration,
        sweep_every: Duration,
        trace: ScriptTracer,
    ) -> Hub {
        let shards = shards.clamp(1, MAX_SHARDS) as usize;
        let id = uuid::Uuid::new_v4().simple().to_string();
        Hub {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    shards: (0..shards).map(|_| Shard::default()).collect(),
                    ..State::default()
                }),
                idle: (0..shards).map(|_| Condvar::new()).collect(),
                sweeper: Condvar::new(),
                sweep_every,
                parking,
                commands,
                control: (0..shards)
                    .map(|shard| format!("{prefix}:parking:{id}:{shard}"))
                    .collect(),
                baton_ttl,
                io_timeout,
                trace,
            }),
            unblocker,
        }
    }

    /// Parks the calling thread until a token of `list` comes to it, or
    /// `park` has passed (at least [`IMPRECISE_FLOOR`] unless `precise`),
    /// or the blocked call it relies on fails, or (with a `watch` key) a
    /// sweep finds `watch` gone.
    /// Ends the park of every waiter, who looks again (as when the blocked
    /// call fails), for `error`: the server stopped answering elsewhere,
    /// and a baton from it may not come for a long while. The blocked
    /// call itself goes on; its keys leave the next one unless waited on
    /// again.
    #[cfg(feature = "redlock")]
    pub(super) fn send_waiters_away(&self, error: &Error) {
        let mut state = self.inner.state.lock();
        let keys: Vec<String> = state.keys.keys().cloned().collect();
        state.end_all(&keys, |_| Outcome::ConnectionFailed(error.clone()));
    }

    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        precise: bool,
        watch: Option<&str>,
    ) -> Result<Parked, Error> {
        let inner = &self.inner;
        let mut park = if precise {
            park
        } else {
            park.max(IMPRECISE_FLOOR)
        };
        let wake = Arc::new(Condvar::new());
        let shard = inner.shard_of(list);
        let mut state = inner.state.lock();
        if state.closed {
            return Ok(Parked::Done);
        }
        if watch.is_some() {
            if !state.sweeping && !state.sweeper_failed {
                match inner.start_sweeper() {
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
        let until = Instant::now() + park;
        let id = state.next_id;
        state.next_id += 1;
        let entry = state.keys.entry(list.to_owned()).or_default();
        entry.waiters.push_back(Waiter {
            id,
            name: name.into(),
            wake: Arc::clone(&wake),
            watch: watch.map(Arc::from),
        });
        entry.vacant_since = None;
        entry.drop_next = false;
        let control_refused = state.control_refused;
        let slot = &mut state.shards[shard];
        let push = slot.issued
            && !slot.blocked_on.contains(list)
            && !slot.control_pending
            && !control_refused;
        if push {
            slot.control_pending = true;
        }
        if !slot.running {
            if let Err(err) = inner.start(shard) {
                log::warn!("redbaton: cannot start a parking thread ({err}); waiters look again every park");
                drop(state);
                thread::sleep(until.saturating_duration_since(Instant::now()));
                let mut state = inner.state.lock();
                return state
                    .leave(list, id)
                    .map_or(Ok(Parked::Done), Outcome::into_parked);
            }
            state.shards[shard].running = true;
        } else if !slot.issued {
            inner.idle[shard].notify_one();
        }
        if push {
            drop(state);
            let pushed = inner.push_control(shard, name);
            state = inner.state.lock();
            if let Err(err) = pushed {
                state.shards[shard].control_pending = false;
                match err {
                    ControlError::Refused(err) => {
                        if !std::mem::replace(&mut state.control_refused, true) {
                            log::warn!(
                                "redbaton: Redis refused a parking control push ({}); waiters on \
                                 names new to a parked connection are seen within \
                                 {REFUSED_BACKSTOP:?} \
                                 (allow RPUSH and PEXPIRE on the prefix's keys)",
                                describe_io(&err)
                            );
                        }
                    }
                    // Looks again, as after a failed park; a token that
                    // came meanwhile is no reason to look twice.
                    ControlError::Failed(err) => {
                        return match state.leave(list, id) {
                            Some(outcome) => outcome.into_parked(),
                            None => Ok(Parked::ConnectionFailed(err)),
                        };
                    }
                }
            }
        }
        loop {
            if let Some(outcome) = state.outcomes.remove(&id) {
                return outcome.into_parked();
            }
            if wake.wait_until(&mut state, until).timed_out() {
                return state
                    .leave(list, id)
                    .map_or(Ok(Parked::Done), Outcome::into_parked);
            }
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        let state = &mut *state;
        state.closed = true;
        self.inner.sweeper.notify_one();
        for (shard, idle) in state.shards.iter().zip(&self.inner.idle) {
            idle.notify_one();
            // Ends the blocked call now, so that the thread ends with the
            // client rather than at the backstop.
            if let (true, Some(id)) = (shard.issued, shard.client_id) {
                if let Some(scheduled) = self.unblocker.schedule(id, Instant::now()) {
                    // Kept until the thread ends: dropped, it would cancel.
                    state.closing.push(scheduled);
                }
            }
        }
    }
}

impl Outcome {
    /// The park's result as the caller sees it; `Err` when the key cannot
    /// be waited on.
    fn into_parked(self) -> Result<Parked, Error> {
        match self {
            Outcome::Woken => Ok(Parked::Done),
            Outcome::ConnectionFailed(err) => Ok(Parked::ConnectionFailed(err)),
            Outcome::Refused(err) => Err(err),
        }
    }
}

enum ControlError {
    /// The server refused the push (an ACL): it will not go better.
    Refused(redis::RedisError),
    /// The transport failed.
    Failed(Error),
}

impl State {
    /// Takes waiter `id` of `list` out (its park ended by its own timer),
    /// unless an outcome came first, which is then drop_next.
    fn leave(&mut self, list: &str, id: u64) -> Option<Outcome> {
        if let Some(outcome) = self.outcomes.remove(&id) {
            return Some(outcome);
        }
        if let Some(entry) = self.keys.get_mut(list) {
            entry.waiters.retain(|waiter| waiter.id != id);
            if entry.waiters.is_empty() {
                entry.vacant_since = Some(Instant::now());
            }
        }
        None
    }

    /// Ends the park of every waiter on `keys` with what `outcome` makes
    /// of its object's name; the keys leave the next call (their waiters
    /// come back if they still wait).
    fn end_all<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k String>,
        mut outcome: impl FnMut(&str) -> Outcome,
    ) {
        for key in keys {
            let Some(entry) = self.keys.get_mut(key) else {
                continue;
            };
            for waiter in entry.waiters.drain(..) {
                self.outcomes.insert(waiter.id, outcome(&waiter.name));
                waiter.wake.notify_one();
            }
            entry.vacant_since = Some(Instant::now());
            entry.drop_next = true;
        }
    }

    /// The distinct watch keys of the waiters parked now.
    fn watched(&self) -> Vec<Arc<str>> {
        let mut seen = HashSet::new();
        self.keys
            .values()
            .flat_map(|entry| &entry.waiters)
            .filter_map(|waiter| waiter.watch.clone())
            .filter(|watch| seen.insert(Arc::clone(watch)))
            .collect()
    }

    /// Ends the park of every waiter whose watch key is in `watches`, with
    /// what `outcome` makes of its object's name. Their baton keys stay in
    /// the call for a while (most such waiters come back).
    fn end_watching(
        &mut self,
        watches: &HashSet<Arc<str>>,
        mut outcome: impl FnMut(&str) -> Outcome,
    ) {
        let now = Instant::now();
        for entry in self.keys.values_mut() {
            let mut kept = VecDeque::with_capacity(entry.waiters.len());
            for waiter in entry.waiters.drain(..) {
                match &waiter.watch {
                    Some(watch) if watches.contains(watch) => {
                        self.outcomes.insert(waiter.id, outcome(&waiter.name));
                        waiter.wake.notify_one();
                    }
                    _ => kept.push_back(waiter),
                }
            }
            if kept.is_empty() && entry.vacant_since.is_none() {
                entry.vacant_since = Some(now);
            }
            entry.waiters = kept;
        }
    }

    /// The keys shard `shard` should block on now; forgets keys whose
    /// waiters left a while ago or whose token was given back.
    fn keys_of(&mut self, inner: &Inner, shard: usize) -> Vec<String> {
        let now = Instant::now();
        self.keys.retain(|_, entry| {
            !entry.waiters.is_empty()
                || !(entry.drop_next
                    || entry
                        .vacant_since
                        .is_some_and(|since| now.duration_since(since) >= VACANT_GRACE))
        });
        self.keys
            .keys()
            .filter(|key| inner.shard_of(key) == shard)
            .cloned()
            .collect()
    }
}

impl Inner {
    fn shard_of(&self, key: &str) -> usize {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        (hasher.finish() % self.idle.len() as u64) as usize
    }

    fn classify(&self, err: redis::RedisError, name: &str) -> Error {
        classify::from_redis(err, name, self.parking.addr(), self.trace)
    }

    /// Starts shard `shard`'s thread.
    fn start(self: &Arc<Self>, shard: usize) -> std::io::Result<()> {
        let inner = Arc::clone(self);
        thread::Builder::new()
            .name(format!("{THREAD_NAME}-{shard}"))
            .spawn(move || inner.run(shard))
            .map(drop)
    }

    /// Starts the sweeper's thread.
    fn start_sweeper(self: &Arc<Self>) -> std::io::Result<()> {
        let inner = Arc::clone(self);
        thread::Builder::new()
            .name(SWEEPER_NAME.to_owned())
            .spawn(move || inner.sweep())
            .map(drop)
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

    /// Which of `watched` do not exist: one `EXISTS` over each chunk of
    /// keys, and only where a chunk counts fewer than it has, one per key.
    fn absent(&self, watched: &[Arc<str>]) -> Result<Vec<Arc<str>>, Error> {
        let mut conn = self.commands.get(self.io_timeout)?;
        let mut gone = Vec::new();
        for chunk in watched.chunks(SWEEP_CHUNK) {
            let keys: Vec<&str> = chunk.iter().map(|key| &**key).collect();
            let there: RedisResult<usize> = conn.run(|c| redis::cmd("EXISTS").arg(&keys).query(c));
            let there = there.map_err(|err| self.classify(err, keys[0]))?;
            if there == keys.len() {
                continue;
            }
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("EXISTS").arg(*key);
            }
            let each: RedisResult<Vec<bool>> = conn.run(|c| pipe.query(c));
            let each = each.map_err(|err| self.classify(err, keys[0]))?;
            gone.extend(
                chunk
                    .iter()
                    .zip(each)
                    .filter(|(_, exists)| !exists)
                    .map(|(key, _)| Arc::clone(key)),
            );
        }
        Ok(gone)
    }

    /// Pushes a control token for `shard`, so that its blocked call is
    /// issued again.
    fn push_control(&self, shard: usize, name: &str) -> Result<(), ControlError> {
        let mut conn = self
            .commands
            .get(self.io_timeout)
            .map_err(ControlError::Failed)?;
        let control = &self.control[shard];
        let pushed: RedisResult<()> = conn.run(|c| {
            redis::pipe()
                .cmd("RPUSH")
                .arg(control)
                .arg(CONTROL_TOKEN)
                .ignore()
                .cmd("PEXPIRE")
                .arg(control)
                .arg(millis(CONTROL_TTL))
                .ignore()
                .exec(c)
        });
        pushed.map_err(|err| {
            if breaks_connection(&err) || classify::is_transient_reply(err.code()) {
                ControlError::Failed(self.classify(err, name))
            } else {
                ControlError::Refused(err)
            }
        })
    }

    /// A shard's thread: blocks on its keys, hands tokens over, until the
    /// hub is dropped.
    fn run(&self, shard: usize) {
        let mut conn: Option<PooledConn> = None;
        loop {
            let keys = {
                let mut state = self.state.lock();
                loop {
                    if state.closed {
                        state.shards[shard].running = false;
                        return;
                    }
                    let keys = state.keys_of(self, shard);
                    let slot = &mut state.shards[shard];
                    if !keys.is_empty() {
                        slot.issued = true;
                        slot.blocked_on = keys.iter().cloned().collect();
                        slot.client_id = conn.as_ref().and_then(|c| c.client_id());
                        break keys;
                    }
                    slot.issued = false;
                    slot.blocked_on.clear();
                    self.idle[shard].wait(&mut state);
                }
            };
            let conn_ref = match &mut conn {
                Some(conn) => conn,
                None => match self.parking.get(self.io_timeout) {
                    Ok(fresh) => {
                        let id = fresh.client_id();
                        self.state.lock().shards[shard].client_id = id;
                        conn.insert(fresh)
                    }
                    Err(err) => {
                        log::debug!("redbaton: no parking connection: {err}");
                        self.fail(shard, &keys, |_| Outcome::ConnectionFailed(err.clone()));
                        continue;
                    }
                },
            };
            let blocked = self.block(conn_ref, shard, &keys);
            self.state.lock().shards[shard].issued = false;
            match blocked {
                Ok(popped) => {
                    if let Some((key, token)) = popped {
                        if let Err(err) = self.hand_over(conn_ref, shard, key, token) {
                            log::debug!(
                                "redbaton: giving a baton back failed ({}); it is lost",
                                describe_io(&err)
                            );
                            self.fail_call(shard, &keys, err);
                        }
                    }
                }
                Err(err) if err.code() == Some("WRONGTYPE") => {
                    self.refuse_wrong_types(conn_ref, shard, &keys);
                }
                Err(err) => self.fail_call(shard, &keys, err),
            }
            if conn.as_ref().is_some_and(|c| c.is_broken()) {
                // Closed when dropped; the next call opens another.
                conn = None;
            }
        }
    }

    /// One blocked call over `keys` and the shard's control list.
    fn block(
        &self,
        conn: &mut PooledConn,
        shard: usize,
        keys: &[String],
    ) -> RedisResult<Option<(String, Vec<u8>)>> {
        let backstop = if self.state.lock().control_refused {
            REFUSED_BACKSTOP
        } else {
            BACKSTOP
        };
        conn.set_read_timeout(backstop + self.io_timeout)?;
        let timeout = format!("{}.{:03}", backstop.as_secs(), backstop.subsec_millis());
        conn.run(|c| {
            redis::cmd("BLPOP")
                .arg(keys)
                .arg(&self.control[shard])
                .arg(&timeout)
                .query(c)
        })
    }

    /// A token of `key` came: to its oldest waiter, or back on its list.
    fn hand_over(
        &self,
        conn: &mut PooledConn,
        shard: usize,
        key: String,
        token: Vec<u8>,
    ) -> RedisResult<()> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        if key == self.control[shard] {
            state.shards[shard].control_pending = false;
            return Ok(());
        }
        if let Some(entry) = state.keys.get_mut(&key) {
            if let Some(waiter) = entry.waiters.pop_front() {
                // Its waiter most likely got what it waited for: the key
                // leaves the next call, or a later baton of it (its own
                // release's) would be popped here only to be given back.
                entry.drop_next = entry.waiters.is_empty();
                state.outcomes.insert(waiter.id, Outcome::Woken);
                waiter.wake.notify_one();
                return Ok(());
            }
            entry.drop_next = true;
        }
        drop(guard);
        // Nobody here waits for it any more: back for someone else. The
        // list holds tokens of one value, so their order does not matter.
        conn.run(|c| {
            redis::pipe()
                .cmd("RPUSH")
                .arg(&key)
                .arg(token)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&key)
                .arg(millis(self.baton_ttl))
                .ignore()
                .exec(c)
        })
    }

    /// The blocked call failed: every waiter of the shard looks again (or,
    /// for an error the server gave, gets it).
    fn fail_call(&self, shard: usize, keys: &[String], err: redis::RedisError) {
        log::debug!(
            "redbaton: parked connection failed ({}); its waiters look again",
            describe_io(&err)
        );
        let transport = breaks_connection(&err) || ends_park(&err);
        self.fail(shard, keys, |name| {
            let error = self.classify(err.clone(), name);
            if transport || error.is_transient() {
                Outcome::ConnectionFailed(error)
            } else {
                Outcome::Refused(error)
            }
        });
    }

    fn fail(&self, shard: usize, keys: &[String], outcome: impl FnMut(&str) -> Outcome) {
        let mut state = self.state.lock();
        state.end_all(keys, outcome);
        let slot = &mut state.shards[shard];
        slot.issued = false;
        slot.blocked_on.clear();
        // A control token may have been swallowed with the call.
        slot.control_pending = false;
    }

    /// `WRONGTYPE`: finds the keys that hold something else than a list;
    /// their waiters get the error, the others park on.
    fn refuse_wrong_types(&self, conn: &mut PooledConn, shard: usize, keys: &[String]) {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("TYPE").arg(key);
        }
        let kinds: RedisResult<Vec<String>> = conn.run(|c| pipe.query(c));
        let wrong: Vec<String> = match kinds {
            Ok(kinds) => keys
                .iter()
                .zip(kinds)
                .filter(|(_, kind)| kind != "list" && kind != "none")
                .map(|(key, _)| key.clone())
                .collect(),
            Err(err) => {
                self.fail_call(shard, keys, err);
                return;
            }
        };
        let mut state = self.state.lock();
        state.end_all(&wrong, |name| Outcome::Refused(wrong_type(name)));
        for key in &wrong {
            state.keys.remove(key);
        }
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

/// Replies that end a blocked call without a token and call for another
/// look: a master demoted under it (`UNBLOCKED`), a server between two
/// states.
fn ends_park(err: &redis::RedisError) -> bool {
    err.code() == Some("UNBLOCKED")
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

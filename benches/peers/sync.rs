//! Figures of redbaton's other primitives (issue 14): the semaphore, the
//! read-write lock and the fair lock, against the `redisson` crate 0.1 (a
//! Rust port of Java Redisson's ideas whose semaphore, read-write lock and
//! fair lock wait by polling), on the same throwaway `redis-server` in the
//! same run.
//!
//! Every time is printed over a `PING` on a raw connection measured in the
//! same run, under the same load: the machine is shared and its load moves,
//! so a cycle's reference is the median of `PING`s interleaved with its
//! rounds (one before each), and a hand-off's the median of `PING`s sent
//! just before each release. The median `PING` of a tight loop at the start
//! is printed too, with the goals' ratios over it (it is the lowest: on this
//! VM a round trip costs more when the server idled a little before it).
//!
//! 1. Uncontended cycle, median of `ROUNDS` after a tenth more untimed:
//!    semaphore `acquire()` + `release()` (a total of 1 permit), `read()` +
//!    unlock, `write()` + unlock, fair `lock()` + unlock; and the commands
//!    one cycle sends (counted over `COUNTED_CYCLES` more). Goals: ≤ 2.5 ×
//!    `PING` for the semaphore and read cycles. redbaton's plain lock cycle
//!    is measured alongside as a reference.
//! 2. Hand-off to another process: the parent holds (the only permit; the
//!    write lock; the fair lock), a child process (this bench again,
//!    `--child handoff ...`, its own clients) is told to ask (acquire; read;
//!    fair lock) and the parent lets go after a hold that varies from round
//!    to round (`hold`, so that a poller's phase is not always the same);
//!    the time from just before the parent's release to just after the
//!    child's acquisition, on the wall clock, median of `HANDOFFS` after
//!    `HANDOFF_WARM_UP` untimed rounds. A round whose child had not asked yet
//!    when the parent let go is no hand-off and is counted apart. Goal for
//!    the fair lock: ≤ 4 × `PING`. The floor of any design that wakes a
//!    waiter parked in Redis is measured the same way: an `RPUSH` to a child
//!    parked in `BLPOP` on a raw connection (`--child baton ...`).
//! 3. Waiting cost: a holder (fixed lease, so no renewals) keeps the fair
//!    lock / the only permit / the write lock, `WAITERS` threads of another
//!    client wait for it (the fair lock; a permit; to write; to read), and
//!    after `WAIT_SETTLE` the commands the server ran in `WAIT_WINDOW` are
//!    counted (`testkit::RedisServer::commands_since`). Only commands
//!    clients send are counted, not those run inside scripts: `EVALSHA`,
//!    `EVAL`, `SCRIPT LOAD`, `BLPOP` and each peer's own plain commands
//!    (`REDBATON_SENT`, `REDISSON_SENT`); printed per waiter per second,
//!    with what became of the waiters once the holder let go.
//!
//! The peer as used here (`redisson_findings` checks and prints each point
//! in every run):
//!
//! - `RReadWriteLock` (lease 30 s): `read_lock().lock()` and
//!   `write_lock().lock()` try a script, then sleep 100 ms and try again,
//!   forever; the bench waits with `try_lock_with_timeout` (the same loop,
//!   bounded) so that a wait that never ends cannot hang it. Its scripts
//!   take the key's TTL from the argument that carries a hash of the thread
//!   id: where that hash is out of `PEXPIRE`'s range, the script fails after
//!   it wrote the hold (a hold nobody owns, with no TTL).
//! - `RFairLock`: `lock()` joins a queue, polls every 100 ms until first in
//!   it, then tries the lock once and, when it is held, returns
//!   `LockAcquisitionError` at once: it does not wait for the holder. The
//!   crate's waiting form is `try_lock_with_timeout`, which calls `lock()`
//!   again 50 ms after each failure; that is what the bench waits with.
//! - `RSemaphore`: `acquire()` (= `try_acquire(1, 0 s)`) cannot succeed: its
//!   script answers a pair that the crate reads as one integer, so every call
//!   returns a type error (the permit is taken all the same). It has no
//!   waiting form. The bench measures the crate's own script
//!   (`redisson::SEMAPHORE_ACQUIRE_SCRIPT`, public) read as the pair it is,
//!   with the crate's `release(1)`, and waits by calling it again every
//!   `REDISSON_SEMAPHORE_POLL` (the poll period of the crate's read-write
//!   lock). The script's `timeout` argument is how long every permit lives
//!   (each call first drops the permits taken longer ago than that): with
//!   `acquire()`'s 0 the semaphore excludes no one, so the bench passes
//!   `REDISSON_SEMAPHORE_WINDOW`. These rows are marked "script, polled".
//! - Every connection the crate takes from its r2d2 pool is checked with a
//!   `PING` first (`test_on_check_out`); those are counted as sent.
//!
//! ```text
//! cargo bench --manifest-path benches/peers/Cargo.toml --bench sync --features redisson
//! ```
//!
//! Needs `redis-server` on PATH; starts its own on a free loopback port
//! (`testkit::RedisServer`) and takes about a minute.

use std::collections::BTreeMap;
use std::env;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redbaton::Client;
use redisson::{RFairLock, RReadLock, RSemaphore, RWriteLock, RedissonClient, RedissonConfig};
use testkit::RedisServer;

/// Timed rounds per median (`PING` and every uncontended cycle); a tenth
/// more run untimed first.
const ROUNDS: usize = 2_000;
/// redbaton's goal for the uncontended semaphore and read cycles, × `PING`.
const CYCLE_GOAL: f64 = 2.5;
/// redbaton's goal for the fair lock's hand-off between processes, × `PING`.
const FAIR_HANDOFF_GOAL: f64 = 4.0;
/// Timed hand-offs per peer and primitive (the median is printed).
const HANDOFFS: usize = 50;
/// Untimed hand-off rounds first, and cycles each side runs before them.
const HANDOFF_WARM_UP: usize = 5;
/// The shortest time the parent keeps the lock after telling the child to
/// ask; each round adds `(round × 37) mod HOLD_SPREAD_MS` ms, spreading the
/// release over a poller's period.
const HANDOFF_HOLD: Duration = Duration::from_millis(10);
const HOLD_SPREAD_MS: u64 = 100;
/// `PING`s the parent sends just before each release of a hand-off run
/// (their mean is that round's reference).
const PINGS_PER_HANDOFF: u32 = 3;
/// Errors one hand-off child tolerates in one wait before it gives up.
const HANDOFF_MAX_ERRORS: usize = 20;
/// Waiting threads in the waiting-cost runs.
const WAITERS: usize = 10;
/// From the waiters' start to the first snapshot: past their first
/// attempts, what waiting costs while the holder keeps holding.
const WAIT_SETTLE: Duration = Duration::from_millis(500);
/// The counted window of a waiting-cost run.
const WAIT_WINDOW: Duration = Duration::from_secs(3);
/// How long a redisson waiter of a waiting-cost run may wait: until a
/// while after the holder's release.
const WAITER_BOUND: Duration = Duration::from_millis(6_500);
/// The fixed lease of the holder in the waiting-cost runs (no renewals).
const HOLDER_LEASE: Duration = Duration::from_secs(60);
/// The lease the redisson locks are taken with (no watchdog).
const REDISSON_LEASE: Duration = Duration::from_secs(30);
/// How long one redisson wait may last before the bench calls it failed.
const REDISSON_WAIT_BOUND: Duration = Duration::from_secs(20);
/// How often the bench asks redisson's semaphore script again.
const REDISSON_SEMAPHORE_POLL: Duration = Duration::from_millis(100);
/// The life of every redisson permit (its script's `timeout` argument).
const REDISSON_SEMAPHORE_WINDOW: Duration = Duration::from_secs(30);
/// Connections in each redisson client's pool (its default is 10, fewer
/// than the waiters and the holder).
const REDISSON_POOL: u32 = 16;
/// What redbaton's clients send besides scripts (none of these runs in its
/// scripts).
const REDBATON_SENT: &[&str] = &[
    "evalsha",
    "eval",
    "script|load",
    "blpop",
    "incr",
    "ping",
    "client|id",
    "client|unblock",
    "config|get",
];
/// What redisson's clients send besides scripts for these primitives (none
/// of these runs in its scripts): `PING` is r2d2's check of every connection
/// it lends (the crate turns `test_on_check_out` on).
const REDISSON_SENT: &[&str] = &[
    "evalsha",
    "eval",
    "script|load",
    "ping",
    "rpush",
    "lindex",
    "lrem",
    "zrangebyscore",
    "zrem",
];

/// The two implementations under test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Redbaton,
    Redisson,
}

impl Peer {
    const ALL: [Peer; 2] = [Peer::Redbaton, Peer::Redisson];

    fn tag(self) -> &'static str {
        match self {
            Peer::Redbaton => "redbaton",
            Peer::Redisson => "redisson",
        }
    }

    fn from_tag(tag: &str) -> Peer {
        Peer::ALL
            .into_iter()
            .find(|peer| peer.tag() == tag)
            .unwrap_or_else(|| panic!("unknown peer {tag}"))
    }
}

/// What a thread takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// One permit of a semaphore of one permit.
    Permit,
    Read,
    Write,
    Fair,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Permit, Kind::Read, Kind::Write, Kind::Fair];

    fn tag(self) -> &'static str {
        match self {
            Kind::Permit => "permit",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Fair => "fair",
        }
    }

    fn from_tag(tag: &str) -> Kind {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.tag() == tag)
            .unwrap_or_else(|| panic!("unknown kind {tag}"))
    }

    /// What the holder takes while a thread of this kind waits: the only
    /// permit, the write lock (for readers and writers), the fair lock.
    fn holder(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            other => other,
        }
    }

    /// The row of the table.
    fn label(self) -> &'static str {
        match self {
            Kind::Permit => "semaphore acquire + release",
            Kind::Read => "rw read + unlock",
            Kind::Write => "rw write + unlock",
            Kind::Fair => "fair lock + unlock",
        }
    }
}

/// The clients a handle is made on: redbaton's, and redisson's (made
/// lazily, so that a redisson failure costs only its own figures).
struct Clients {
    redbaton: Client,
    redisson: Option<Arc<RedissonClient>>,
}

impl Clients {
    fn new(url: &str, peer: Peer) -> Result<Clients, String> {
        let redbaton = Client::open(url).map_err(|err| format!("redbaton client: {err}"))?;
        let redisson = match peer {
            Peer::Redbaton => None,
            Peer::Redisson => Some(Arc::new(redisson_client(url)?)),
        };
        Ok(Clients { redbaton, redisson })
    }
}

fn redisson_client(url: &str) -> Result<RedissonClient, String> {
    RedissonClient::new(RedissonConfig::single_server(url).with_pool_size(REDISSON_POOL))
        .map_err(|err| format!("RedissonClient::new: {err}"))
}

/// One thread's handle on one primitive of one peer.
enum Handle {
    Semaphore(redbaton::Semaphore),
    Rw(redbaton::RwLock, Kind),
    Fair(redbaton::Lock),
    RedissonPermit {
        client: Arc<RedissonClient>,
        semaphore: RSemaphore,
        name: String,
    },
    RedissonRead(RReadLock),
    RedissonWrite(RWriteLock),
    RedissonFair(RFairLock),
}

/// What `Handle::take` got (redisson keeps its holds in the handle).
enum Held {
    Permit(redbaton::SemaphorePermit),
    Read(redbaton::ReadGuard),
    Write(redbaton::WriteGuard),
    Guard(redbaton::LockGuard),
    Redisson,
}

/// A permit id for redisson's semaphore script, unique on the machine.
fn permit_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn now_ms() -> i64 {
    (now_ns() / 1_000_000) as i64
}

/// One call of redisson's semaphore script for one permit: granted or not.
fn redisson_semaphore_try(
    client: &RedissonClient,
    name: &str,
    window: Duration,
) -> Result<bool, String> {
    let mut conn = client
        .get_connection_manager()
        .get_connection()
        .map_err(|err| format!("get_connection: {err}"))?;
    let (granted, _available): (i64, i64) = redisson::SEMAPHORE_ACQUIRE_SCRIPT
        .key(name)
        .arg(permit_id())
        .arg(1)
        .arg(window.as_millis() as i64)
        .arg(now_ms())
        .invoke(&mut conn)
        .map_err(|err| format!("semaphore script: {err}"))?;
    Ok(granted > 0)
}

impl Handle {
    /// `peer`'s `kind` on the primitive `name`: redbaton's on `clients`'
    /// client, with a fixed `lease` if given; a semaphore of 1 permit.
    fn new(
        peer: Peer,
        kind: Kind,
        name: &str,
        clients: &Clients,
        lease: Option<Duration>,
    ) -> Result<Handle, String> {
        fn err(what: &'static str) -> impl Fn(redbaton::Error) -> String {
            move |e| format!("{what}: {e}")
        }
        Ok(match (peer, kind) {
            (Peer::Redbaton, Kind::Permit) => {
                let mut semaphore = clients.redbaton.semaphore(name).map_err(err("name"))?;
                semaphore
                    .try_set_permits(1)
                    .map_err(err("try_set_permits"))?;
                if let Some(lease) = lease {
                    semaphore = semaphore.with_fixed_lease(lease).map_err(err("lease"))?;
                }
                Handle::Semaphore(semaphore)
            }
            (Peer::Redbaton, Kind::Read | Kind::Write) => {
                let mut rw = clients.redbaton.rw_lock(name).map_err(err("name"))?;
                if let Some(lease) = lease {
                    rw = rw.with_fixed_lease(lease).map_err(err("lease"))?;
                }
                Handle::Rw(rw, kind)
            }
            (Peer::Redbaton, Kind::Fair) => {
                let mut lock = clients.redbaton.fair_lock(name).map_err(err("name"))?;
                if let Some(lease) = lease {
                    lock = lock.with_fixed_lease(lease).map_err(err("lease"))?;
                }
                Handle::Fair(lock)
            }
            (Peer::Redisson, _) => {
                let client = Arc::clone(clients.redisson.as_ref().expect("a redisson client"));
                match kind {
                    Kind::Permit => Handle::RedissonPermit {
                        // Sets the total (1) when the semaphore has none.
                        semaphore: client.get_semaphore(name, 1),
                        client,
                        name: name.to_owned(),
                    },
                    Kind::Read => Handle::RedissonRead(
                        client.get_read_write_lock(name, REDISSON_LEASE).read_lock(),
                    ),
                    Kind::Write => Handle::RedissonWrite(
                        client
                            .get_read_write_lock(name, REDISSON_LEASE)
                            .write_lock(),
                    ),
                    Kind::Fair => Handle::RedissonFair(client.get_fair_lock(name)),
                }
            }
        })
    }

    /// Waits until held, or a failure: redbaton's blocking calls; for
    /// redisson, with `bound` its waiting forms bounded by it (see the top of
    /// this file), without it the plain `lock()` (for a lock expected free).
    fn take(&self, bound: Option<Duration>) -> Result<Held, String> {
        let timed_out = || format!("not held after {:?}", bound.unwrap_or_default());
        match self {
            Handle::Semaphore(semaphore) => semaphore
                .acquire()
                .map(Held::Permit)
                .map_err(|err| format!("acquire: {err}")),
            Handle::Rw(rw, Kind::Read) => rw
                .read()
                .map(Held::Read)
                .map_err(|err| format!("read: {err}")),
            Handle::Rw(rw, _) => rw
                .write()
                .map(Held::Write)
                .map_err(|err| format!("write: {err}")),
            Handle::Fair(lock) => lock
                .lock()
                .map(Held::Guard)
                .map_err(|err| format!("lock: {err}")),
            Handle::RedissonPermit { client, name, .. } => {
                let deadline = Instant::now() + bound.unwrap_or(REDISSON_WAIT_BOUND);
                loop {
                    if redisson_semaphore_try(client, name, REDISSON_SEMAPHORE_WINDOW)? {
                        return Ok(Held::Redisson);
                    }
                    if Instant::now() >= deadline {
                        return Err(timed_out());
                    }
                    thread::sleep(REDISSON_SEMAPHORE_POLL);
                }
            }
            Handle::RedissonRead(read) => {
                match bound {
                    None => read.lock().map_err(|err| format!("read lock: {err}"))?,
                    Some(bound) => {
                        if !read
                            .try_lock_with_timeout(bound)
                            .map_err(|err| format!("read lock: {err}"))?
                        {
                            return Err(timed_out());
                        }
                    }
                }
                Ok(Held::Redisson)
            }
            Handle::RedissonWrite(write) => {
                match bound {
                    None => write.lock().map_err(|err| format!("write lock: {err}"))?,
                    Some(bound) => {
                        if !write
                            .try_lock_with_timeout(bound)
                            .map_err(|err| format!("write lock: {err}"))?
                        {
                            return Err(timed_out());
                        }
                    }
                }
                Ok(Held::Redisson)
            }
            Handle::RedissonFair(fair) => {
                match bound {
                    None => fair.lock().map_err(|err| format!("fair lock: {err}"))?,
                    Some(bound) => {
                        if !fair
                            .try_lock_with_timeout(bound)
                            .map_err(|err| format!("fair lock: {err}"))?
                        {
                            return Err(timed_out());
                        }
                    }
                }
                Ok(Held::Redisson)
            }
        }
    }

    /// Lets `held` go.
    fn give(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (_, Held::Permit(permit)) => permit.release().map_err(|err| format!("release: {err}")),
            (_, Held::Read(guard)) => guard.unlock().map_err(|err| format!("unlock: {err}")),
            (_, Held::Write(guard)) => guard.unlock().map_err(|err| format!("unlock: {err}")),
            (_, Held::Guard(guard)) => guard.unlock().map_err(|err| format!("unlock: {err}")),
            (Handle::RedissonPermit { semaphore, .. }, Held::Redisson) => semaphore
                .release(1)
                .map_err(|err| format!("release: {err}")),
            (Handle::RedissonRead(read), Held::Redisson) => match read.unlock() {
                Ok(true) => Ok(()),
                Ok(false) => Err("read unlock: false (not released)".to_owned()),
                Err(err) => Err(format!("read unlock: {err}")),
            },
            (Handle::RedissonWrite(write), Held::Redisson) => match write.unlock() {
                Ok(true) => Ok(()),
                Ok(false) => Err("write unlock: false (not released)".to_owned()),
                Err(err) => Err(format!("write unlock: {err}")),
            },
            // `unlock` answers false when it released the lock fully (its
            // script's 0), so only an error counts.
            (Handle::RedissonFair(fair), Held::Redisson) => fair
                .unlock()
                .map(drop)
                .map_err(|err| format!("fair unlock: {err}")),
            _ => unreachable!("a hold given back to another handle"),
        }
    }

    /// One uncontended take + give.
    fn cycle(&self) -> Result<(), String> {
        let held = self.take(None)?;
        self.give(held)
    }
}

/// The median time of one call of `f` over `rounds` calls, after
/// `rounds / 10` untimed ones; the first error ends it.
fn median(rounds: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<Duration, String> {
    for _ in 0..rounds / 10 {
        f()?;
    }
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        f()?;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    Ok(times[rounds / 2])
}

/// One `PING` on `conn`.
fn ping(conn: &mut redis::Connection) -> Result<(), String> {
    redis::cmd("PING")
        .query::<String>(conn)
        .map(drop)
        .map_err(|err| format!("PING: {err}"))
}

/// Like `median`, with a `PING` on `conn` before each call of `f`: the
/// medians of `f` and of those `PING`s, taken under the same load.
fn paired_median(
    rounds: usize,
    conn: &mut redis::Connection,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<(Duration, Duration), String> {
    let mut pings = Vec::with_capacity(rounds);
    let mut fs = Vec::with_capacity(rounds);
    for round in 0..rounds + rounds / 10 {
        let started = Instant::now();
        ping(conn)?;
        let pinged = Instant::now();
        f()?;
        if round >= rounds / 10 {
            pings.push(pinged - started);
            fs.push(pinged.elapsed());
        }
    }
    pings.sort_unstable();
    fs.sort_unstable();
    Ok((fs[rounds / 2], pings[rounds / 2]))
}

/// Nanoseconds on the wall clock (CLOCK_REALTIME): comparable between the
/// processes of one machine.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Microseconds, with one decimal below 1 ms.
fn us_text(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", us(d))
    } else {
        format!("{:.0} µs", us(d))
    }
}

/// A multiple of `PING`, with fewer decimals as it grows.
fn times_ping(x: f64) -> String {
    if x.abs() < 10.0 {
        format!("{x:.2} ×")
    } else if x.abs() < 100.0 {
        format!("{x:.1} ×")
    } else {
        format!("{x:.0} ×")
    }
}

/// Of the commands the server ran, those `peer`'s clients sent (not those
/// its scripts ran).
fn sent_by(peer: Peer, ran: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let sent = match peer {
        Peer::Redbaton => REDBATON_SENT,
        Peer::Redisson => REDISSON_SENT,
    };
    ran.into_iter()
        .filter(|(command, calls)| sent.contains(&command.as_str()) && *calls > 0)
        .collect()
}

/// An uncontended cycle: its median time, and the commands one cycle sends
/// (counted over `COUNTED_CYCLES` more cycles).
struct Cycle {
    median: Duration,
    /// The median of the `PING`s interleaved with the timed cycles.
    ping: Duration,
    sent: BTreeMap<String, u64>,
}

/// Cycles over which the commands of one cycle are counted.
const COUNTED_CYCLES: u64 = 100;

/// The uncontended cycle of `peer`'s `kind`.
fn uncontended(peer: Peer, kind: Kind, server: &RedisServer) -> Result<Cycle, String> {
    let clients = Clients::new(&server.url(), peer)?;
    let name = format!("bench:sync:uncontended:{}:{}", kind.tag(), peer.tag());
    let handle = Handle::new(peer, kind, &name, &clients, None)?;
    let (median, ping) = paired_median(ROUNDS, &mut server.connection(), || handle.cycle())?;
    let before = server.command_calls();
    for _ in 0..COUNTED_CYCLES {
        handle.cycle()?;
    }
    Ok(Cycle {
        median,
        ping,
        sent: sent_by(peer, server.commands_since(&before)),
    })
}

/// `sent` (of `COUNTED_CYCLES` cycles) per cycle: "2 (evalsha 2)".
fn per_cycle(sent: &BTreeMap<String, u64>) -> String {
    let per = |calls: u64| calls as f64 / COUNTED_CYCLES as f64;
    let each: Vec<String> = sent
        .iter()
        .map(|(command, &calls)| format!("{command} {}", per(calls)))
        .collect();
    format!("{} ({})", per(sent.values().sum()), each.join(", "))
}

/// What a hand-off run showed.
struct Handoff {
    /// Release → the waiting child's acquisition, sorted.
    times: Vec<Duration>,
    /// Timed rounds in which the child had not asked yet when the parent
    /// let go (no hand-off).
    not_waiting: usize,
    /// Errors on either side (each side asks again), and the first one.
    errors: usize,
    first_error: Option<String>,
    /// Why the run ended early, if it did.
    failure: Option<String>,
    /// `PING`s the parent sent just before each timed release, sorted.
    pings: Vec<Duration>,
}

impl Handoff {
    fn error(&mut self, err: String) {
        self.errors += 1;
        self.first_error.get_or_insert(err);
    }

    fn at(&self, q: f64) -> Option<Duration> {
        let last = self.times.len().checked_sub(1)?;
        Some(self.times[(last as f64 * q).round() as usize])
    }

    /// The median of the `PING`s taken just before the timed releases.
    fn ping(&self) -> Duration {
        self.pings
            .get(self.pings.len() / 2)
            .copied()
            .unwrap_or_default()
    }
}

/// How long the parent holds in hand-off round `round`.
fn hold(round: usize) -> Duration {
    HANDOFF_HOLD + Duration::from_millis((round as u64 * 37) % HOLD_SPREAD_MS)
}

impl Handoff {
    fn failed(why: String) -> Handoff {
        Handoff {
            times: Vec::new(),
            not_waiting: 0,
            errors: 0,
            first_error: None,
            failure: Some(why),
            pings: Vec::new(),
        }
    }
}

/// The hand-off run of `peer`: the parent (this thread, its own clients)
/// holds `waiter.holder()`, the child process asks for `waiter`, the parent
/// lets go.
fn handoff(peer: Peer, waiter: Kind, server: &RedisServer) -> Handoff {
    let url = &server.url();
    let name = format!("bench:sync:handoff:{}:{}", waiter.tag(), peer.tag());
    let holder = Clients::new(url, peer)
        .and_then(|c| Handle::new(peer, waiter.holder(), &name, &c, None).map(|h| (c, h)));
    let holder = match holder {
        Ok((_clients, holder)) => holder,
        Err(err) => return Handoff::failed(err),
    };
    for _ in 0..HANDOFF_WARM_UP {
        if let Err(err) = holder.cycle() {
            return Handoff::failed(format!("holder's warm-up: {err}"));
        }
    }
    let child = ["handoff", peer.tag(), waiter.tag(), &name, url];
    handoff_rounds(
        &mut server.connection(),
        &child,
        || holder.take(Some(REDISSON_WAIT_BOUND)),
        |held| holder.give(held),
    )
}

/// The floor of any hand-off that wakes a waiter parked in Redis: the
/// child parks in `BLPOP` on a raw connection, the parent "lets go" with
/// an `RPUSH` on its own; the same rounds as `handoff`.
fn handoff_floor(server: &RedisServer) -> Handoff {
    let key = "bench:sync:floor";
    let mut conn = server.connection();
    if let Err(err) = redis::cmd("DEL").arg(key).query::<i64>(&mut conn) {
        return Handoff::failed(format!("DEL: {err}"));
    }
    let url = server.url();
    handoff_rounds(
        &mut server.connection(),
        &["baton", key, &url],
        || Ok(()),
        |()| {
            redis::cmd("RPUSH")
                .arg(key)
                .arg(1)
                .query::<i64>(&mut conn)
                .map(drop)
                .map_err(|err| format!("RPUSH: {err}"))
        },
    )
}

/// The rounds of a hand-off run: the parent takes (`take`), tells the child
/// process (this bench with `--child` and `child`) to ask, holds for
/// `hold(round)` and lets go (`give`); the child reports when it asked and
/// got it.
fn handoff_rounds<H>(
    pings: &mut redis::Connection,
    child: &[&str],
    mut take: impl FnMut() -> Result<H, String>,
    mut give: impl FnMut(H) -> Result<(), String>,
) -> Handoff {
    let mut run = Handoff {
        times: Vec::new(),
        not_waiting: 0,
        errors: 0,
        first_error: None,
        failure: None,
        pings: Vec::new(),
    };
    let mut child = Command::new(env::current_exe().expect("current exe"))
        .arg("--child")
        .args(child)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hand-off child");
    let mut to_child = child.stdin.take().expect("child stdin");
    let mut from_child = BufReader::new(child.stdout.take().expect("child stdout")).lines();
    match from_child.next().and_then(Result::ok) {
        Some(line) if line == "READY" => {}
        other => run.failure = Some(format!("the child did not start ({other:?})")),
    }
    for round in 0..HANDOFF_WARM_UP + HANDOFFS {
        if run.failure.is_some() {
            break;
        }
        // Free: the child let go before it reported its turn.
        let held = match take() {
            Ok(held) => held,
            Err(err) => {
                run.error(format!("holder: {err}"));
                if run.errors > HANDOFF_MAX_ERRORS {
                    run.failure = Some("too many errors".to_owned());
                }
                continue;
            }
        };
        if writeln!(to_child, "GO")
            .and_then(|()| to_child.flush())
            .is_err()
        {
            run.failure = Some("the child is gone".to_owned());
            drop(give(held));
            break;
        }
        thread::sleep(hold(round));
        // The reference for this round, in the same conditions.
        let pinged = Instant::now();
        let pinged = match (0..PINGS_PER_HANDOFF).try_for_each(|_| ping(pings)) {
            Ok(()) => pinged.elapsed() / PINGS_PER_HANDOFF,
            Err(err) => {
                run.error(format!("holder: {err}"));
                Duration::ZERO
            }
        };
        let released = now_ns();
        if let Err(err) = give(held) {
            run.error(format!("holder: {err}"));
        }
        let turn = loop {
            match from_child.next().and_then(Result::ok) {
                Some(line) => match line.strip_prefix("ERR ") {
                    Some(err) => run.error(format!("waiter: {err}")),
                    None => {
                        let n: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
                        break n.get(0..2).map(|n| (n[0], n[1]));
                    }
                },
                None => break None,
            }
        };
        let Some((asked, got)) = turn else {
            run.failure = Some(format!("the child ended in round {round}"));
            break;
        };
        if round < HANDOFF_WARM_UP {
            continue;
        }
        if asked < released {
            run.times
                .push(Duration::from_nanos(got.saturating_sub(released)));
            run.pings.push(pinged);
        } else {
            run.not_waiting += 1;
        }
    }
    drop(to_child);
    match child.wait() {
        Ok(status) if !status.success() => {
            run.failure
                .get_or_insert(format!("the child exited with {status}"));
        }
        Ok(_) => {}
        Err(err) => {
            run.failure.get_or_insert(format!("the child: {err}"));
        }
    }
    run.times.sort_unstable();
    run.pings.sort_unstable();
    run
}

/// A hand-off child: on each `GO` from the parent it asks (`take`; the
/// parent holds), and once it has it, lets go (`give`) and prints when it
/// asked and got it. Ends when stdin does.
fn run_child_rounds<H>(
    mut take: impl FnMut() -> Result<H, String>,
    mut give: impl FnMut(H) -> Result<(), String>,
) {
    println!("READY");
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if line != "GO" {
            break;
        }
        let asked = now_ns();
        let mut errors = 0;
        let held = loop {
            match take() {
                Ok(held) => break held,
                Err(err) => {
                    println!("ERR {}", err.replace('\n', " "));
                    errors += 1;
                    assert!(
                        errors < HANDOFF_MAX_ERRORS,
                        "hand-off child: {errors} errors in one wait"
                    );
                }
            }
        };
        let got = now_ns();
        if let Err(err) = give(held) {
            println!("ERR {}", err.replace('\n', " "));
        }
        println!("{asked} {got}");
    }
}

/// The child of `handoff`: its own clients on `name`, asking for `kind`.
fn run_handoff_child(peer: Peer, kind: Kind, name: &str, url: &str) {
    let clients = Clients::new(url, peer).expect("child's clients");
    let waiter = Handle::new(peer, kind, name, &clients, None).expect("child's handle");
    for _ in 0..HANDOFF_WARM_UP {
        waiter.cycle().expect("child's warm-up");
    }
    run_child_rounds(
        || waiter.take(Some(REDISSON_WAIT_BOUND)),
        |held| waiter.give(held),
    );
}

/// The child of `handoff_floor`: `BLPOP` on a raw connection.
fn run_baton_child(key: &str, url: &str) {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("child's connection");
    for _ in 0..HANDOFF_WARM_UP {
        redis::cmd("PING")
            .query::<String>(&mut conn)
            .expect("child's PING");
    }
    let mut pop = || {
        redis::cmd("BLPOP")
            .arg(key)
            .arg(0)
            .query::<(String, String)>(&mut conn)
            .map(drop)
            .map_err(|err| format!("BLPOP: {err}"))
    };
    run_child_rounds(&mut pop, |()| Ok(()));
}

/// What a waiting-cost run showed.
struct Waiting {
    /// Counted commands per waiter per second of the window.
    per_waiter_second: f64,
    /// The counted commands, by name.
    counted: BTreeMap<String, u64>,
    /// Waiters that got it after the holder let go, and the failures (how
    /// many of each).
    served: usize,
    errors: BTreeMap<String, usize>,
    /// What redisson's read-write lock key holds once every waiter is done
    /// (nothing when it is gone, as it should be).
    left: Option<String>,
}

impl Waiting {
    fn error(&mut self, err: String) {
        *self.errors.entry(err).or_default() += 1;
    }
}

/// `WAITERS` threads of another client wait for `kind` while a holder keeps
/// `kind.holder()`; the commands of `WAIT_WINDOW`, after `WAIT_SETTLE`.
fn waiting_cost(
    peer: Peer,
    kind: Kind,
    url: &str,
    server: &RedisServer,
) -> Result<Waiting, String> {
    let name = format!("bench:sync:waiting:{}:{}", kind.tag(), peer.tag());
    let holder_clients = Clients::new(url, peer)?;
    let holder = Handle::new(
        peer,
        kind.holder(),
        &name,
        &holder_clients,
        Some(HOLDER_LEASE),
    )?;
    let held = holder.take(None)?;
    let waiter_clients = Arc::new(Clients::new(url, peer)?);
    let start = Arc::new(Barrier::new(WAITERS + 1));
    let threads: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (clients, start, name) = (
                Arc::clone(&waiter_clients),
                Arc::clone(&start),
                name.clone(),
            );
            thread::spawn(move || -> Result<(), String> {
                let handle = Handle::new(peer, kind, &name, &clients, None);
                start.wait();
                let handle = handle?;
                let held = handle.take(Some(WAITER_BOUND))?;
                handle.give(held)
            })
        })
        .collect();
    start.wait();
    thread::sleep(WAIT_SETTLE);
    let before = server.command_calls();
    thread::sleep(WAIT_WINDOW);
    let during = server.commands_since(&before);
    let released = holder.give(held);
    let mut run = Waiting {
        per_waiter_second: 0.0,
        counted: BTreeMap::new(),
        served: 0,
        errors: BTreeMap::new(),
        left: None,
    };
    if let Err(err) = released {
        run.error(format!("holder: {err}"));
    }
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => run.served += 1,
            Ok(Err(err)) => run.error(err),
            Err(_) => run.error("a waiter panicked".to_owned()),
        }
    }
    run.counted = sent_by(peer, during);
    if peer == Peer::Redisson && matches!(kind, Kind::Read | Kind::Write) {
        let mut conn = server.connection();
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&name)
            .query(&mut conn)
            .map_err(|err| format!("HGETALL: {err}"))?;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&name)
            .query(&mut conn)
            .map_err(|err| format!("PTTL: {err}"))?;
        if !fields.is_empty() {
            run.left = Some(format!("{fields:?}, PTTL {pttl} ms"));
        }
    }
    let total: u64 = run.counted.values().sum();
    run.per_waiter_second = total as f64 / WAITERS as f64 / WAIT_WINDOW.as_secs_f64();
    Ok(run)
}

/// What the redisson crate does with the calls one would use, checked on
/// `url` and printed: the reasons behind the way the bench drives it.
fn redisson_findings(url: &str) -> Result<Vec<String>, String> {
    let client = redisson_client(url)?;
    let mut found = Vec::new();

    let semaphore = client.get_semaphore("bench:sync:findings:semaphore", 1);
    found.push(format!(
        "RSemaphore::acquire() on a free semaphore of 1 permit: {:?}",
        semaphore.acquire()
    ));
    drop(semaphore.release(1));
    let first = redisson_semaphore_try(&client, "bench:sync:findings:window0", Duration::ZERO)?;
    thread::sleep(Duration::from_millis(5));
    let second = redisson_semaphore_try(&client, "bench:sync:findings:window0", Duration::ZERO)?;
    found.push(format!(
        "its script as acquire() calls it (timeout 0), twice on a semaphore of 1 permit, the first permit never released: granted {first}, then {second}{}",
        if first && second {
            " (the second call dropped the first holder's permit: two holders of one permit)"
        } else {
            ""
        }
    ));

    let fair = client.get_fair_lock("bench:sync:findings:fair");
    fair.lock().map_err(|err| format!("fair lock: {err}"))?;
    let other = client.get_fair_lock("bench:sync:findings:fair");
    let asked = Instant::now();
    let result = other.lock();
    found.push(format!(
        "RFairLock::lock() while another holds it: {result:?} after {}",
        us_text(asked.elapsed())
    ));
    found.push(format!(
        "RFairLock::unlock() of a full release: {:?}",
        fair.unlock()
    ));
    found.push(format!(
        "RFairLock::try_lock() on a free fair lock: {:?}",
        other.try_lock()
    ));

    let read = client
        .get_read_write_lock("bench:sync:findings:rw", REDISSON_LEASE)
        .read_lock();
    read.lock().map_err(|err| format!("read lock: {err}"))?;
    let mut conn = client
        .get_connection_manager()
        .get_connection()
        .map_err(|err| format!("get_connection: {err}"))?;
    let pttl: i64 = redis::cmd("PTTL")
        .arg("bench:sync:findings:rw")
        .query(&mut conn)
        .map_err(|err| format!("PTTL: {err}"))?;
    drop(conn);
    found.push(format!(
        "read lock taken with a {} ms lease: its key's PTTL is {pttl} ms (the script reads its TTL from the argument that carries a hash of the thread id)",
        REDISSON_LEASE.as_millis()
    ));
    drop(read.unlock());
    Ok(found)
}

/// Prints `rows` as a table: columns padded to their widest cell, a rule
/// under the first row.
fn print_table(rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &w)| format!("{cell:<w$}"))
            .collect();
        println!("  {}", cells.join(" | ").trim_end());
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
            println!("  {}", rule.join("-+-"));
        }
    }
}

fn ratio(d: Duration, ping: Duration) -> f64 {
    d.as_secs_f64() / ping.as_secs_f64()
}

fn verdict(ratio: f64, goal: f64) -> &'static str {
    if ratio <= goal {
        "met"
    } else {
        "NOT MET"
    }
}

/// The kinds with a hand-off column: a permit, read behind a write, the
/// fair lock.
const HANDOFF_KINDS: [Kind; 3] = [Kind::Permit, Kind::Read, Kind::Fair];

fn main() {
    let args: Vec<String> = env::args().skip_while(|a| a != "--child").skip(1).collect();
    match &args[..] {
        [] => {}
        [role, peer, kind, name, url] if role == "handoff" => {
            return run_handoff_child(Peer::from_tag(peer), Kind::from_tag(kind), name, url)
        }
        [role, key, url] if role == "baton" => return run_baton_child(key, url),
        other => panic!("unknown child role {other:?}"),
    }
    let started = Instant::now();
    let server = RedisServer::start();
    let url = server.url();
    let ping = median(ROUNDS, {
        let mut conn = server.connection();
        move || {
            redis::cmd("PING")
                .query::<String>(&mut conn)
                .map(drop)
                .map_err(|err| err.to_string())
        }
    })
    .expect("PING");
    // A figure over the `PING` measured alongside it: "120 µs / 40.0 µs = 3.00 ×".
    let vs = |d: Duration, ping: Duration| {
        format!(
            "{} / {} = {}",
            us_text(d),
            us_text(ping),
            times_ping(ratio(d, ping))
        )
    };
    println!("redbaton sync benchmarks (issue 14): the semaphore, read-write lock and fair lock vs the redisson crate 0.1, on one local redis-server");
    println!(
        "PING (raw connection, median of {ROUNDS}) at the start: {}. The machine is shared and its load moves, so each time below is set over PINGs taken alongside it (interleaved with the cycle's rounds; just before each hand-off's release): \"time / PING = ratio\"\n",
        us_text(ping)
    );

    println!(
        "redisson as found in this run (why it is driven the way the top of benches/sync.rs says):"
    );
    match redisson_findings(&url) {
        Ok(found) => found.iter().for_each(|f| println!("  - {f}")),
        Err(err) => println!("  - FAILED: {err}"),
    }
    println!();

    // [peer][kind]
    let cycles: Vec<Vec<Result<Cycle, String>>> = Peer::ALL
        .iter()
        .map(|&peer| {
            Kind::ALL
                .iter()
                .map(|&kind| uncontended(peer, kind, &server))
                .collect()
        })
        .collect();
    let plain_lock = Client::open(&url)
        .and_then(|client| client.lock("bench:sync:plain"))
        .map_err(|err| err.to_string())
        .and_then(|lock| {
            paired_median(ROUNDS, &mut server.connection(), || {
                lock.lock()
                    .and_then(|guard| guard.unlock())
                    .map_err(|err| err.to_string())
            })
        });
    let floor = handoff_floor(&server);
    let handoffs: Vec<Vec<Handoff>> = Peer::ALL
        .iter()
        .map(|&peer| {
            HANDOFF_KINDS
                .iter()
                .map(|&kind| handoff(peer, kind, &server))
                .collect()
        })
        .collect();
    let waits: Vec<Vec<Result<Waiting, String>>> = Peer::ALL
        .iter()
        .map(|&peer| {
            Kind::ALL
                .iter()
                .map(|&kind| waiting_cost(peer, kind, &url, &server))
                .collect()
        })
        .collect();

    let peer_name = |peer: Peer, kind: Kind| match (peer, kind) {
        (Peer::Redisson, Kind::Permit) => "redisson (script, polled)",
        _ => peer.tag(),
    };
    let handoff_text = |run: &Handoff, what: &str| match (run.at(0.5), &run.failure) {
        (Some(d), None) => format!("{}{what}", vs(d, run.ping())),
        (Some(d), Some(_)) => format!("{}{what} (cut short)", vs(d, run.ping())),
        (None, _) => "FAILED".to_owned(),
    };
    let mut rows = vec![vec![
        "primitive".to_owned(),
        "peer".to_owned(),
        "uncontended cycle".to_owned(),
        "commands sent per cycle".to_owned(),
        "hand-off to another process (median)".to_owned(),
        format!("waiting: commands / waiter / s ({WAITERS} waiters)"),
    ]];
    for (k, &kind) in Kind::ALL.iter().enumerate() {
        for (p, &peer) in Peer::ALL.iter().enumerate() {
            let (cycle, sent) = match &cycles[p][k] {
                Ok(c) => (vs(c.median, c.ping), per_cycle(&c.sent)),
                Err(err) => (format!("FAILED: {err}"), "-".to_owned()),
            };
            let handoff = match HANDOFF_KINDS.iter().position(|&h| h == kind) {
                None => "-".to_owned(),
                Some(h) => handoff_text(
                    &handoffs[p][h],
                    if kind == Kind::Read {
                        " (read behind a write)"
                    } else {
                        ""
                    },
                ),
            };
            let waiting = match &waits[p][k] {
                Ok(w) => {
                    let what = match kind {
                        Kind::Read => " (readers behind a write)",
                        Kind::Write => " (writers behind a write)",
                        _ => "",
                    };
                    format!("{:.2}{what}", w.per_waiter_second)
                }
                Err(err) => format!("FAILED: {err}"),
            };
            rows.push(vec![
                kind.label().to_owned(),
                peer_name(peer, kind).to_owned(),
                cycle,
                sent,
                handoff,
                waiting,
            ]);
        }
    }
    rows.push(vec![
        "references".to_owned(),
        "redbaton plain lock; raw".to_owned(),
        match &plain_lock {
            Ok((d, ping)) => format!("{} (plain lock)", vs(*d, *ping)),
            Err(err) => format!("FAILED: {err}"),
        },
        "-".to_owned(),
        handoff_text(&floor, " (RPUSH → BLPOP)"),
        "-".to_owned(),
    ]);
    print_table(&rows);

    println!("\ngoals (issue 14), redbaton:");
    for kind in [Kind::Permit, Kind::Read] {
        let k = Kind::ALL.iter().position(|&c| c == kind).expect("kind");
        match &cycles[0][k] {
            Ok(c) => println!(
                "  {} ≤ {CYCLE_GOAL} × PING: {} ({}; over the PING at the start: {})",
                kind.label(),
                verdict(ratio(c.median, c.ping), CYCLE_GOAL),
                vs(c.median, c.ping),
                times_ping(ratio(c.median, ping))
            ),
            Err(err) => println!("  {} ≤ {CYCLE_GOAL} × PING: FAILED ({err})", kind.label()),
        }
    }
    let fair = &handoffs[0][2];
    match fair.at(0.5) {
        Some(d) => println!(
            "  fair lock hand-off between processes ≤ {FAIR_HANDOFF_GOAL} × PING: {} ({}; over the PING at the start: {}; the RPUSH → BLPOP floor: {})",
            verdict(ratio(d, fair.ping()), FAIR_HANDOFF_GOAL),
            vs(d, fair.ping()),
            times_ping(ratio(d, ping)),
            floor
                .at(0.5)
                .map_or("-".to_owned(), |f| vs(f, floor.ping()))
        ),
        None => println!("  fair lock hand-off between processes ≤ {FAIR_HANDOFF_GOAL} × PING: FAILED"),
    }

    println!("\nnotes:");
    println!("  uncontended cycle: median of {ROUNDS}; redbaton's semaphore releases with release(), its locks with unlock(); commands sent per cycle counted over {COUNTED_CYCLES} more cycles (only what the client sends, not what its scripts run)");
    println!("  hand-off: the parent holds {HANDOFF_HOLD:?} + (round × 37 mod {HOLD_SPREAD_MS}) ms after telling the child to ask; redisson's waits poll (semaphore: the bench, every {REDISSON_SEMAPHORE_POLL:?}; read: every 100 ms; fair: 50 ms after each failed lock())");
    let opt_us = |d: Option<Duration>| d.map_or("-".to_owned(), us_text);
    let handoff_note = |who: &str, run: &Handoff| {
        println!(
            "  hand-off, {who}: {} hand-offs (median, p90, max {} / {} / {}), {} rounds not waiting yet, {} errors{}{}",
            run.times.len(),
            opt_us(run.at(0.5)),
            opt_us(run.at(0.9)),
            opt_us(run.at(1.0)),
            run.not_waiting,
            run.errors,
            run.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
            run.failure
                .as_ref()
                .map(|f| format!("; FAILED: {f}"))
                .unwrap_or_default()
        );
    };
    for (p, &peer) in Peer::ALL.iter().enumerate() {
        for (h, &kind) in HANDOFF_KINDS.iter().enumerate() {
            handoff_note(
                &format!("{} {}", peer_name(peer, kind), kind.tag()),
                &handoffs[p][h],
            );
        }
    }
    handoff_note("floor (RPUSH → a BLPOP parked in the child)", &floor);
    println!("  waiting: the holder keeps it with a fixed {HOLDER_LEASE:?} lease; {WAIT_SETTLE:?} after the waiters start, the commands of {WAIT_WINDOW:?} are counted");
    for (p, &peer) in Peer::ALL.iter().enumerate() {
        for (k, &kind) in Kind::ALL.iter().enumerate() {
            if let Ok(w) = &waits[p][k] {
                let counted: Vec<String> = w
                    .counted
                    .iter()
                    .map(|(command, calls)| format!("{command} {calls}"))
                    .collect();
                let errors: Vec<String> = w
                    .errors
                    .iter()
                    .map(|(err, n)| format!("{n} × {err}"))
                    .collect();
                println!(
                    "  waiting, {} {}: counted {}; after the release {} of {WAITERS} waiters served{}{}",
                    peer_name(peer, kind),
                    kind.tag(),
                    if counted.is_empty() {
                        "none".to_owned()
                    } else {
                        counted.join(", ")
                    },
                    w.served,
                    if errors.is_empty() {
                        String::new()
                    } else {
                        format!("; FAILED: {}", errors.join("; "))
                    },
                    w.left
                        .as_ref()
                        .map(|left| format!("; the lock's key is left holding {left}"))
                        .unwrap_or_default()
                );
            }
        }
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
}

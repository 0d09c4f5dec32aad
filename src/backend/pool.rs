//! Connections to Redis: an r2d2 manager that never hands out a connection
//! whose state is unknown.
//!
//! redis-rs keeps a connection "open" after a read timeout, but the reply
//! it timed out on may still arrive and would then be read as the answer to
//! the next command (for a `BLPOP`, that reply is a baton: a wake-up stolen
//! from every other waiter). So every transport error marks the connection
//! broken, and r2d2 drops it instead of pooling it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ConnectionLike, RedisError, RedisResult};
use scheduled_thread_pool::ScheduledThreadPool;

use super::classify::{breaks_connection, describe_io, is_auth_failure};
use crate::error::Error;

/// How long a caller waits for a connection before it looks whether the
/// last connect was refused for good.
const CHECKOUT_SLICE: Duration = Duration::from_millis(20);

/// Waiters for a full pool per [`CHECKOUT_SLICE`] of their slices.
const SLICE_WAITERS: u32 = 16;

thread_local! {
    /// When the exchanges this thread runs must be answered by, if sooner
    /// than their connections' read timeouts (see [`answered_by`]).
    static ANSWER_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `work` with every exchange it makes on a pooled connection (and
/// every wait for one) ending by `deadline`: a reply not in by then is a
/// timeout, as one past the I/O timeout is. For the watchdog, whose
/// renewal of a short-lived hold is no use once the hold has ended, and
/// whose round passes through layers (each synchronizer's renewal, a
/// cluster's redirections, the sentinels' master) that need not know.
pub(crate) fn answered_by<T>(deadline: Instant, work: impl FnOnce() -> T) -> T {
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ANSWER_DEADLINE.set(self.0);
        }
    }
    let _restore = Restore(ANSWER_DEADLINE.replace(Some(deadline)));
    work()
}

/// `timeout`, or less where this thread's exchanges must be answered
/// sooner (see [`answered_by`]); at least 1 ms, as a zero timeout is
/// refused by the socket.
fn bounded(timeout: Duration) -> Duration {
    match ANSWER_DEADLINE.get() {
        Some(deadline) => timeout
            .min(deadline.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1)),
        None => timeout,
    }
}

/// A pooled Redis connection with a "state unknown" mark.
pub(crate) struct Conn {
    inner: redis::Connection,
    /// How long its reads wait (the I/O timeout, or what the caller set).
    read_timeout: Duration,
    /// The server's `CLIENT ID` of this connection, read when it was
    /// opened, for pools whose connections may need unblocking; `None` when
    /// not asked or refused.
    client_id: Option<i64>,
    broken: bool,
    /// The pool's generation when this connection was opened.
    generation: u64,
    health: Arc<Health>,
}

/// Shared by a pool's connections: a transport failure on one of them
/// starts a new generation, and idle connections of older generations are
/// closed instead of handed out. After a server restart every idle
/// connection is dead, and without this each caller would meet one of them
/// and fail once.
#[derive(Debug, Default)]
pub(crate) struct Health {
    generation: AtomicU64,
    /// Callers waiting for a connection of a full pool now.
    waiting: AtomicUsize,
}

impl Conn {
    /// The server's id of this connection (`CLIENT ID`), if known.
    pub(crate) fn client_id(&self) -> Option<i64> {
        self.client_id
    }

    /// Runs one exchange; a transport error marks the connection broken so
    /// that it is closed when it goes back to the pool.
    pub(crate) fn run<T>(
        &mut self,
        exchange: impl FnOnce(&mut redis::Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let shortened = Some(bounded(self.read_timeout)).filter(|&t| t < self.read_timeout);
        if let Some(timeout) = shortened {
            self.inner
                .set_read_timeout(Some(timeout))
                .inspect_err(|_| {
                    self.broken = true;
                })?;
        }
        let result = exchange(&mut self.inner);
        if shortened.is_some()
            && self
                .inner
                .set_read_timeout(Some(self.read_timeout))
                .is_err()
        {
            self.broken = true;
        }
        if let Err(err) = &result {
            if breaks_connection(err) {
                self.broken = true;
                self.health.generation.fetch_add(1, Ordering::AcqRel);
            }
        }
        result
    }

    /// The connection itself, for a caller that changes its state for
    /// good (a subscriber, a connection with tracking on). Marked broken
    /// first, so that it is closed, never pooled again, when dropped; a
    /// caller that uses it this way does its own error handling.
    pub(crate) fn keep(&mut self) -> &mut redis::Connection {
        self.broken = true;
        &mut self.inner
    }

    /// Sets how long the next reads may wait (a `BLPOP` needs longer than the
    /// I/O timeout).
    pub(crate) fn set_read_timeout(&mut self, timeout: Duration) -> RedisResult<()> {
        let result = self.inner.set_read_timeout(Some(timeout));
        match result {
            Ok(()) => self.read_timeout = timeout,
            Err(_) => self.broken = true,
        }
        result
    }
}

/// The last failure to open a connection, kept so that a pool wait that
/// ends empty-handed can say "unreachable" rather than "pool busy".
/// Cloned into the manager and r2d2's error handler; all clones share one
/// record.
#[derive(Debug, Default, Clone)]
pub(crate) struct ConnectFailures {
    last: Arc<Mutex<Option<RedisError>>>,
    /// Set when a connect was refused (nothing listening), cleared by the
    /// next one that works.
    refused: Arc<AtomicBool>,
}

impl r2d2::HandleError<RedisError> for ConnectFailures {
    fn handle_error(&self, error: RedisError) {
        log::debug!(
            "redbaton: opening a Redis connection failed: {}",
            describe_io(&error)
        );
        if error.is_connection_refusal() {
            self.refused.store(true, Ordering::Release);
        }
        *self.last.lock() = Some(error);
    }
}

/// Opens connections with the I/O timeout on connect, read and write.
#[derive(Debug)]
pub(crate) struct Manager {
    client: redis::Client,
    io_timeout: Duration,
    /// Sent with `CLIENT SETNAME` on every new connection.
    client_name: Arc<str>,
    /// Whether to read each new connection's `CLIENT ID`.
    identify: bool,
    /// Set once the server refused `CLIENT ID`.
    id_refused: AtomicBool,
    failures: ConnectFailures,
    health: Arc<Health>,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = RedisError;

    fn connect(&self) -> RedisResult<Conn> {
        let mut inner = self
            .client
            .get_connection_with_timeout(self.io_timeout)
            .map_err(|err| self.why_dropped(err))?;
        inner.set_read_timeout(Some(self.io_timeout))?;
        inner.set_write_timeout(Some(self.io_timeout))?;
        set_client_name(&mut inner, &self.client_name)?;
        let client_id = if self.identify {
            self.read_client_id(&mut inner)?
        } else {
            None
        };
        *self.failures.last.lock() = None;
        self.failures.refused.store(false, Ordering::Release);
        Ok(Conn {
            inner,
            read_timeout: self.io_timeout,
            client_id,
            broken: false,
            generation: self.health.generation.load(Ordering::Acquire),
            health: Arc::clone(&self.health),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> RedisResult<()> {
        conn.run(|c| redis::cmd("PING").query::<()>(c))
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || !conn.inner.is_open()
    }
}

impl Manager {
    /// A connect that the server dropped may have been refused with a
    /// parting message that the handshake did not read (Redis writes
    /// `-ERR max number of clients reached` and closes at once). Listens
    /// for it on a second, plain TCP connection, and returns it as the
    /// error when there is one.
    fn why_dropped(&self, err: RedisError) -> RedisError {
        if !err.is_connection_dropped() {
            return err;
        }
        let redis::ConnectionAddr::Tcp(host, port) = self.client.get_connection_info().addr()
        else {
            return err;
        };
        match parting_words(host, *port) {
            Some(words) => (
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "the server refused the connection",
                words,
            )
                .into(),
            None => err,
        }
    }

    /// A new connection's `CLIENT ID`: `None` when the server refuses it
    /// (an ACL without it; warned about once per pool); a transport error
    /// fails the connect.
    fn read_client_id(&self, conn: &mut redis::Connection) -> RedisResult<Option<i64>> {
        match redis::cmd("CLIENT").arg("ID").query(conn) {
            Ok(id) => Ok(Some(id)),
            Err(err) if !breaks_connection(&err) => {
                if !self.id_refused.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "redbaton: Redis refused CLIENT ID ({err}); waiters wake on the server's timer, \
                         up to 100 ms late (hz 10). Grant +client|id +client|unblock (see the ACL line in redbaton's docs/security.md)"
                    );
                }
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }
}

/// Names a new connection (`CLIENT SETNAME`), so that `CLIENT LIST` tells
/// an operator whose it is. A refusal (an ACL without it) leaves the
/// connection unnamed, with one warning per process (every server of a
/// deployment has the same ACL as a rule); a transport error is returned.
pub(crate) fn set_client_name(conn: &mut redis::Connection, name: &str) -> RedisResult<()> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    match redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(name)
        .query::<()>(conn)
    {
        Ok(()) => Ok(()),
        Err(err) if !breaks_connection(&err) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "redbaton: Redis refused CLIENT SETNAME ({err}); connections stay unnamed in \
                     CLIENT LIST. Grant +client|setname (see redbaton's docs/security.md)"
                );
            }
            Ok(())
        }
        Err(err) => Err(err),
    }
}

/// What a server says on a new connection before any command, if it
/// speaks first (an error line, as at `maxclients`). Short timeouts: this
/// only runs after a failed connect.
fn parting_words(host: &str, port: u16) -> Option<String> {
    use std::io::Read;
    use std::net::{TcpStream, ToSocketAddrs};

    const PROBE: Duration = Duration::from_millis(200);
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut stream = TcpStream::connect_timeout(&addr, PROBE).ok()?;
    stream.set_read_timeout(Some(PROBE)).ok()?;
    let mut buf = [0u8; 256];
    let read = stream.read(&mut buf).ok()?;
    let line = std::str::from_utf8(&buf[..read]).ok()?;
    let words = line.strip_prefix('-')?.trim_end();
    let words = words.strip_prefix("ERR ").unwrap_or(words);
    Some(words.to_owned())
}

/// One bounded pool of connections to one server. Cheap to clone: clones
/// share the connections.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pool: r2d2::Pool<Manager>,
    failures: ConnectFailures,
    health: Arc<Health>,
    /// `host:port`, for error messages (never the password).
    addr: Arc<str>,
}

/// A connection borrowed from a [`Pool`]; goes back (or is closed) on drop.
pub(crate) type PooledConn = r2d2::PooledConnection<Manager>;

impl Pool {
    /// Builds a pool without connecting: the first caller connects, so a
    /// client can be made before Redis is up.
    pub(crate) fn new(
        client: redis::Client,
        max_size: u32,
        io_timeout: Duration,
        client_name: &Arc<str>,
        name: &str,
        identify: bool,
        workers: &Arc<ScheduledThreadPool>,
    ) -> Pool {
        let addr: Arc<str> = client.get_connection_info().addr().to_string().into();
        let failures = ConnectFailures::default();
        let health = Arc::new(Health::default());
        let manager = Manager {
            client,
            io_timeout,
            client_name: Arc::clone(client_name),
            identify,
            id_refused: AtomicBool::new(false),
            failures: failures.clone(),
            health: Arc::clone(&health),
        };
        let pool = r2d2::Pool::builder()
            .max_size(max_size)
            .min_idle(Some(0))
            // Checking out with a PING would double the round trips of every
            // lock call; broken connections are caught by `Conn::run` instead.
            .test_on_check_out(false)
            .connection_timeout(io_timeout)
            // No reaper: its job, scheduled every 30 s, kept the worker
            // threads alive that long after the client was dropped. Stale
            // idle connections are caught when used (see `Conn::run`).
            .idle_timeout(None)
            .max_lifetime(None)
            .thread_pool(Arc::clone(workers))
            .error_handler(Box::new(failures.clone()))
            .build_unchecked(manager);
        log::debug!("redbaton: {name} pool of {max_size} connections to {addr}");
        Pool {
            pool,
            failures,
            health,
            addr,
        }
    }

    /// `host:port` of the server.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Borrows a connection, waiting at most `wait`.
    ///
    /// # Errors
    /// [`Error::Unreachable`] when the pool had room but could not connect,
    /// [`Error::PoolTimeout`] when every connection stayed busy.
    pub(crate) fn get(&self, wait: Duration) -> Result<PooledConn, Error> {
        let wait = bounded(wait);
        let deadline = Instant::now() + wait;
        loop {
            let mut conn = self.checkout(deadline.saturating_duration_since(Instant::now()))?;
            if conn.generation >= self.health.generation.load(Ordering::Acquire) {
                return Ok(conn);
            }
            // Opened before a transport failure: probably dead. Closed when
            // dropped; bounded, since every connection is replaced once.
            conn.broken = true;
        }
    }

    /// An idle connection, if one is at hand now: never waits, never
    /// connects.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn idle(&self) -> Option<PooledConn> {
        loop {
            let mut conn = self.pool.try_get()?;
            if conn.generation >= self.health.generation.load(Ordering::Acquire) {
                return Some(conn);
            }
            // As in `get`: opened before a transport failure.
            conn.broken = true;
        }
    }

    /// Waits for a connection in short slices, so that a connect Redis
    /// answered with a refusal (a wrong password, `maxclients`, a database
    /// it does not have) is reported at once: no later try will go better.
    fn checkout(&self, wait: Duration) -> Result<PooledConn, Error> {
        let deadline = Instant::now() + wait;
        let _counted = Waiting::count(&self.health.waiting);
        loop {
            // Nothing listened last time: ask once without waiting (which
            // also starts another connect in the background) and report.
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = if self.failures.refused.load(Ordering::Acquire) {
                Duration::ZERO
            } else if self.pool.state().connections >= self.pool.max_size() {
                // Every connection is open and lent: the wait is for one to
                // come back, which wakes one waiter at once. Still in
                // slices, as a connection closed broken wakes nobody: the
                // next slice's end opens its replacement. The slices grow
                // with the number of waiters, as each slice's end walks the
                // condition variable's whole queue: with 10,000 threads
                // waiting in 20 ms slices, the connections coming back
                // starved behind the walks (`PoolTimeout` after 60 s).
                let waiting = self.health.waiting.load(Ordering::Relaxed).max(1);
                let scaled = CHECKOUT_SLICE
                    .saturating_mul(u32::try_from(waiting).unwrap_or(u32::MAX) / SLICE_WAITERS + 1);
                left.min(scaled)
            } else {
                left.min(CHECKOUT_SLICE)
            };
            if let Ok(conn) = self.pool.get_timeout(slice) {
                return Ok(conn);
            }
            // With room in the pool, the wait is for a new connection that
            // could not be opened: Redis is the problem, not the pool.
            let full = self.pool.state().connections >= self.pool.max_size();
            if full && Instant::now() >= deadline {
                return Err(Error::PoolTimeout { waited: wait });
            }
            if full {
                continue;
            }
            let last = self.failures.last.lock().clone();
            // The last connect was refused (nothing listens there) and none
            // has worked since: waiting longer will not change it, and a
            // quorum must not pay a whole timeout per round for a dead
            // master. The pool keeps trying in the background; the first
            // connect that works clears the mark.
            let refused_now = self.failures.refused.load(Ordering::Acquire);
            match last {
                Some(err) if refused_now => {
                    return Err(Error::Unreachable {
                        addr: self.addr.to_string(),
                        detail: describe_io(&err),
                        timed_out: false,
                        source: Some(err),
                    })
                }
                Some(err) if is_auth_failure(&err) => {
                    return Err(Error::AuthenticationFailed {
                        addr: self.addr.to_string(),
                        detail: describe_io(&err),
                        source: Some(err),
                    })
                }
                Some(err) if !breaks_connection(&err) => {
                    return Err(Error::Refused {
                        addr: self.addr.to_string(),
                        detail: err.detail().map_or_else(|| err.to_string(), str::to_owned),
                    })
                }
                _ if Instant::now() < deadline => {}
                Some(err) => {
                    return Err(Error::Unreachable {
                        addr: self.addr.to_string(),
                        detail: describe_io(&err),
                        timed_out: err.is_timeout(),
                        source: Some(err),
                    })
                }
                None => {
                    return Err(Error::Unreachable {
                        addr: self.addr.to_string(),
                        detail: format!("no connection could be opened within {wait:?}"),
                        timed_out: true,
                        source: None,
                    })
                }
            }
        }
    }
}

/// Counts a caller waiting for a connection while it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

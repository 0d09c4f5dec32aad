//! One Redis server: a pool for short commands and a pool for parked
//! connections, kept apart so that waiters never take the connection a
//! releasing holder needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisResult};
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};

use super::classify::{self, breaks_connection, describe_io, is_redirection, ScriptTracer};
use super::hub::{self, Hub};
use super::pool::{Pool, PooledConn};
use super::unblock::Unblocker;
use super::version;
use super::{Failed, Grants, NodeParked, ParkHow, Parked, Sent};
use crate::config::Config;
use crate::error::Error;

/// The least time given to opening a parking connection (a park in
/// `BLPOP`).
const CONNECT_ALLOWANCE: Duration = Duration::from_millis(50);

pub(super) struct Single {
    /// Short commands: scripts, `INCR`, `EXISTS`. Each is held for one round
    /// trip, never while waiting.
    commands: Pool,
    /// Connections parked in `BLPOP` on one key each (a cluster's parks,
    /// and every park where the server refuses the hub's tracking).
    parking: Pool,
    /// Two connections that carry every waiter's wake-up (one server,
    /// Sentinel, a quorum's masters).
    hub: Hub,
    /// The longest park without a look when the hub is refused (no sweep
    /// then notices a lock gone).
    max_park: Duration,
    /// Ends parks on time rather than on the server's timer tick (parks
    /// in `BLPOP`).
    unblocker: Arc<Unblocker>,
    io_timeout: Duration,
    trace: ScriptTracer,
    memory_policy_checked: AtomicBool,
    /// Set once the server's version was read: the version when it is
    /// too old for redbaton, which then refuses every exchange.
    too_old: OnceLock<Option<String>>,
}

/// A failed send, before it is classified: a flavor that routes (Cluster,
/// Sentinel) acts on some replies (a redirection, `READONLY`) first.
pub(super) enum SendError {
    /// No connection could be had: nothing was sent.
    NoConnection(Error),
    /// What Redis or the transport answered.
    Reply(redis::RedisError),
}

/// The threads that open connections for every pool of one client; they
/// end when the pools do. Two, so that a slow connect of one pool does not
/// hold up another's.
pub(super) fn connect_workers() -> Arc<ScheduledThreadPool> {
    Arc::new(
        ScheduledThreadPool::builder()
            .num_threads(2)
            .thread_name_pattern("redbaton-connect-{}")
            // A connection being opened when the client goes is no longer
            // wanted.
            .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
            .build(),
    )
}

impl Single {
    /// Pools for the server `client` points at, opening connections on
    /// `workers`; a `cluster_node` serves some slots of a Cluster.
    pub(super) fn new(
        client: redis::Client,
        config: &Config,
        trace: ScriptTracer,
        workers: &Arc<ScheduledThreadPool>,
        cluster_node: bool,
        grants: Option<Arc<Grants>>,
    ) -> Self {
        let commands = Pool::new(
            client.clone(),
            config.pool_size,
            config.io_timeout,
            &config.client_name,
            "command",
            false,
            workers,
        );
        let unblocker = Arc::new(Unblocker::new(commands.clone(), config.io_timeout));
        // Parked connections are identified, so that the timer can end
        // their park.
        let parking = Pool::new(
            client.clone(),
            config.parking_connections,
            config.io_timeout,
            &config.client_name,
            "parking",
            true,
            workers,
        );
        // The hub's listener and tracker: identified, as the listener's
        // id is what the tracker's announcements are redirected to.
        let links = Pool::new(
            client,
            hub::LINKS,
            config.io_timeout,
            &config.client_name,
            "parking hub",
            true,
            workers,
        );
        Single {
            hub: Hub::new(
                links,
                commands.clone(),
                config.baton_ttl,
                config.io_timeout,
                config.max_park,
                cluster_node,
                trace,
                grants,
            ),
            max_park: config.max_park,
            unblocker,
            commands,
            parking,
            io_timeout: config.io_timeout,
            trace,
            memory_policy_checked: AtomicBool::new(false),
            too_old: OnceLock::new(),
        }
    }

    pub(super) fn addr(&self) -> &str {
        self.commands.addr()
    }

    /// Whether a release's grant may reach a waiter parked here (see
    /// `Hub::takes_grants`).
    pub(super) fn takes_grants(&self) -> bool {
        self.hub.takes_grants()
    }

    /// Wakes this client's waiters parked on `list` here, with no
    /// command; whether there were any (see `Backend::wake_parked`).
    pub(super) fn wake_parked(&self, list: &str) -> bool {
        self.hub.wake(list)
    }

    /// The crate's error for `err`, met while working on object `name`.
    pub(super) fn classify(&self, err: redis::RedisError, name: &str) -> Error {
        classify::from_redis(err, name, self.addr(), self.trace)
    }

    /// Runs one exchange on a command connection; see
    /// [`Backend::exchange`](super::Backend::exchange).
    pub(super) fn exchange<T>(
        &self,
        name: &str,
        exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Sent<T>, Failed> {
        self.send(exchange)
            .map_err(|failed| self.failed(failed, name))
    }

    /// The caller's view of a failed send.
    pub(super) fn failed(&self, failed: SendError, name: &str) -> Failed {
        match failed {
            SendError::NoConnection(error) => Failed {
                error,
                outcome_unknown: false,
            },
            SendError::Reply(err) => Failed {
                outcome_unknown: breaks_connection(&err),
                error: self.classify(err, name),
            },
        }
    }

    /// [`Single::exchange`] without classifying the failure.
    pub(super) fn send<T>(
        &self,
        mut exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Sent<T>, SendError> {
        let mut resent = false;
        loop {
            let mut conn = self
                .commands
                .get(self.io_timeout)
                .map_err(SendError::NoConnection)?;
            self.check_version_once(&mut conn)
                .map_err(SendError::NoConnection)?;
            self.check_memory_policy_once(&mut conn);
            match conn.run(|c| exchange(c)) {
                Ok(value) => return Ok(Sent { value, resent }),
                // A pooled connection can be dead without anyone knowing:
                // the server closed it after its `timeout`, a proxy or NAT
                // dropped it, an operator ran `CLIENT KILL`.
                Err(err) if err.is_connection_dropped() && !resent => {
                    log::debug!(
                        "redbaton: a pooled connection was dropped ({}); sending again on a fresh one",
                        describe_io(&err)
                    );
                    resent = true;
                }
                Err(err) => return Err(SendError::Reply(err)),
            }
        }
    }

    /// Sends `packed` on a command connection without reading the reply:
    /// the first half of a round sent to several servers at once. Waits
    /// for a connection until `until` at most.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(super) fn begin(&self, packed: &[u8], until: Instant) -> Result<PooledConn, SendError> {
        let conn = self
            .commands
            .get(until.saturating_duration_since(Instant::now()))
            .map_err(SendError::NoConnection)?;
        Self::write(conn, packed)
    }

    /// [`Single::begin`] on an idle connection, without waiting; `None`
    /// when none is at hand (nothing was sent).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(super) fn begin_idle(&self, packed: &[u8]) -> Option<Result<PooledConn, SendError>> {
        self.commands.idle().map(|conn| Self::write(conn, packed))
    }

    fn write(mut conn: PooledConn, packed: &[u8]) -> Result<PooledConn, SendError> {
        conn.run(|c| c.send_packed_command(packed))
            .map_err(SendError::Reply)?;
        Ok(conn)
    }

    /// Reads the reply to what [`Single::begin`] sent, waiting until
    /// `until` at most (a late reply closes the connection).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(super) fn finish(
        &self,
        conn: &mut PooledConn,
        until: Instant,
    ) -> Result<redis::Value, SendError> {
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        conn.set_read_timeout(left).map_err(SendError::Reply)?;
        let reply = conn.run(|c| c.recv_response().and_then(redis::Value::extract_error));
        // Pooled again with the usual timeout (a broken one is closed).
        if conn.set_read_timeout(self.io_timeout).is_err() {
            log::debug!("redbaton: could not reset a connection's read timeout");
        }
        reply.map_err(SendError::Reply)
    }

    /// Refuses a server older than redbaton needs, with a clear error from
    /// the first exchange on, instead of a failure in the middle of a run.
    fn check_version_once(&self, conn: &mut PooledConn) -> Result<(), Error> {
        let too_old = match self.too_old.get() {
            Some(too_old) => too_old,
            None => match conn.run(version::too_old) {
                Ok(found) => self.too_old.get_or_init(|| found),
                // Looked at again on the next exchange.
                Err(err) => {
                    log::debug!("redbaton: server version not read: {}", describe_io(&err));
                    return Ok(());
                }
            },
        };
        match too_old {
            Some(version) => Err(Error::UnsupportedServer {
                addr: self.addr().to_owned(),
                version: version.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Warns once per client when the server may evict lock keys: under
    /// memory pressure a `volatile-*` or `allkeys-*` policy deletes a held
    /// lock, and another client can take it while its holder still works.
    /// `CONFIG GET` may be refused (ACL, managed services): no error, but
    /// a warning that the check could not run.
    fn check_memory_policy_once(&self, conn: &mut PooledConn) {
        // A load first: every exchange passes here, and a swap would write
        // the shared flag each time.
        if self.memory_policy_checked.load(Ordering::Relaxed)
            || self.memory_policy_checked.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let policy: RedisResult<Vec<String>> = conn.run(|c| {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query(c)
        });
        match policy.as_deref() {
            Ok([_, policy]) if policy != "noeviction" => log::warn!(
                "redbaton: Redis at {} has maxmemory-policy {policy}: when it reaches maxmemory it may \
                 evict a held lock, and another client can then take it while its holder still works \
                 (a renewed guard reports is_lost() at its next renewal). Use noeviction, or a Redis \
                 that holds nothing but locks",
                self.addr()
            ),
            Ok(_) => {}
            // Once per client and server, like the warning it stands for:
            // a policy that may evict held locks would otherwise go unseen.
            Err(err) => log::warn!(
                "redbaton: cannot read maxmemory-policy of Redis at {} ({}), so whether it may \
                 evict held locks was not checked; allow CONFIG GET (ACL +config|get) or make \
                 sure the policy is noeviction",
                self.addr(),
                describe_io(err)
            ),
        }
    }

    /// Parks until a token of `list` comes or `park` has passed, on the
    /// hub's shared parking connections; see
    /// [`Backend::park`](super::Backend::park). The park's end is the
    /// waiter's own timer: a `precise` park ends on time; the others last
    /// at least the server's timer tick, as they did in Redis. A `watch`
    /// key's absence ends the park too, within `max_park`.
    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        how: ParkHow<'_>,
    ) -> Result<Parked, Error> {
        let park_until = Instant::now() + park;
        match self.park_node(name, list, park_until, how, false)? {
            NodeParked::Parked(parked) => Ok(parked),
            NodeParked::Redirected(err) => Err(self.classify(err, name)),
        }
    }

    /// [`Single::park`] as one node of a Cluster parks, until `park_until`:
    /// a redirection is handed back, not classified, for the cluster to
    /// follow. `asking`: after `ASK` (the list's slot is being imported
    /// here), the waiter parks in `BLPOP` after `ASKING` on a connection of
    /// its own, which the hub's shared tracker cannot do for one key.
    pub(super) fn park_node(
        &self,
        name: &str,
        list: &str,
        park_until: Instant,
        how: ParkHow<'_>,
        asking: bool,
    ) -> Result<NodeParked, Error> {
        if !asking {
            let park = park_until.saturating_duration_since(Instant::now());
            if let Some(parked) = self.hub.park(name, list, park, how)? {
                return Ok(parked);
            }
        }
        // A connection of its own (after `ASK`, or where the server refuses
        // the hub) is swept by nobody, so a watched park is as short as any
        // other (an unwatched one lasts `max_park` at most anyway).
        let park_until = park_until.min(Instant::now() + self.max_park);
        self.park_on(name, list, park_until, how.precise, asking)
    }

    /// Ends every park on this server: its waiters look again (a Redlock
    /// quorum found this master not answering, and parks elsewhere).
    #[cfg(feature = "redlock")]
    pub(super) fn send_waiters_away(&self, error: &Error) {
        self.hub.send_waiters_away(error);
    }

    /// Parks in `BLPOP` on `list` until `park_until` at most, after
    /// `ASKING` when `asking` (a cluster's importing node serves the list
    /// for this one command). A redirection is handed back, not
    /// classified: a cluster follows it.
    pub(super) fn park_on(
        &self,
        name: &str,
        list: &str,
        park_until: Instant,
        precise: bool,
        asking: bool,
    ) -> Result<NodeParked, Error> {
        let park = park_until.saturating_duration_since(Instant::now());
        // Opening a parking connection may take a round trip or two even
        // when the park itself is short.
        let wait_for_connection = park.max(CONNECT_ALLOWANCE).min(self.io_timeout);
        let mut conn = match self.parking.get(wait_for_connection) {
            Ok(conn) => conn,
            // Every parking connection is busy with other names: this
            // thread waited here instead, then looks again. Bounded: one
            // attempt per park interval, as when parked.
            Err(Error::PoolTimeout { .. }) => {
                log::debug!("redbaton: no free parking connection for {name:?}");
                return Ok(NodeParked::Parked(Parked::Done));
            }
            // No new parking connection in time: the next attempt, with the
            // full I/O timeout, tells whether Redis is really out of reach.
            Err(err @ Error::Unreachable { .. }) => {
                return Ok(NodeParked::Parked(Parked::ConnectionFailed(err)))
            }
            Err(err) => return Err(err),
        };
        let park = park_until.saturating_duration_since(Instant::now());
        if park.is_zero() {
            return Ok(NodeParked::Parked(Parked::Done));
        }
        // BLPOP takes seconds with millisecond precision; 0 means "forever".
        let millis = park.as_millis().clamp(1, u128::from(u32::MAX));
        let timeout = format!("{}.{:03}", millis / 1000, millis % 1000);
        // The socket must outlast the server-side timeout: a client that
        // gave up first would leave a BLPOP behind that could swallow a
        // token. If it fails anyway, `Conn::run` marks the connection broken
        // and dropping it closes the socket, which cancels the BLPOP.
        conn.set_read_timeout(park + self.io_timeout)
            .map_err(|err| self.classify(err, name))?;
        // The timer ends the park on time; the server's own timeout (up to a
        // tick late) is the backstop.
        let scheduled = conn
            .client_id()
            .filter(|_| precise)
            .and_then(|id| self.unblocker.schedule(id, park_until));
        let parked: RedisResult<Option<(String, String)>> = conn.run(|c| {
            if asking {
                // Holds for the next command of this connection only.
                redis::cmd("ASKING").exec(c)?;
            }
            redis::cmd("BLPOP").arg(list).arg(&timeout).query(c)
        });
        drop(scheduled);
        match parked {
            Ok(_token) => Ok(NodeParked::Parked(Parked::Done)),
            // Nothing blocked: the list's slot is served, or being
            // imported, elsewhere. The connection is in step and stays
            // pooled.
            Err(err) if is_redirection(&err) => Ok(NodeParked::Redirected(err)),
            // A parked connection that was killed, reset or timed out is
            // closed (never pooled again) and counts as a wake-up: the next
            // attempt, on a command connection, tells whether Redis is
            // really gone, and if not, the waiter parks on a fresh one.
            Err(err) if breaks_connection(&err) || ends_park(&err) => {
                log::debug!(
                    "redbaton: parked connection for {name:?} failed ({}); looking again",
                    describe_io(&err)
                );
                Ok(NodeParked::Parked(Parked::ConnectionFailed(
                    self.classify(err, name),
                )))
            }
            Err(err) => Err(self.classify(err, name)),
        }
    }
}

/// Replies that end a park without a token and call for another look: a
/// cluster between two configurations (`TRYAGAIN`, `CLUSTERDOWN`), or a
/// master demoted under the waiter (`UNBLOCKED`).
fn ends_park(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown)
    ) || err.code() == Some("UNBLOCKED")
}

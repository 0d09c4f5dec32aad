//! A master watched by Redis Sentinel: the sentinels say which server is
//! the master of the service, `ROLE` confirms it, and every exchange goes
//! to it over pools made for that master alone (a [`Single`] per
//! resolution). The master is looked up again after `READONLY` (a demoted
//! master or a replica), a failed or timed-out connection, or a
//! `+switch-master` event, which one thread per client follows on one
//! sentinel connection. Pools from before a failover are never reused:
//! each lookup makes new ones.
//!
//! redis-rs's sentinel client is not used: it does not follow failovers
//! by itself, and its connections are not pooled the way parking needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::{ConnectionLike, RedisResult, Value};
use scheduled_thread_pool::ScheduledThreadPool;

use super::classify::{describe_io, is_auth_failure, ScriptTracer};
use super::pool::set_client_name;
use super::single::{SendError, Single};
use super::{addrs_of, client_at, Failed, Grants, ParkHow, Parked, Sent};
use crate::config::Config;
use crate::error::Error;
use crate::observe::{Event, Observer};

/// Name of the thread that follows `+switch-master`.
const THREAD_NAME: &str = "redbaton-sentinel";

/// How often the event thread looks whether its client is gone, and waits
/// before it tries the next sentinel after a failure.
const WATCH_TICK: Duration = Duration::from_millis(250);

pub(super) struct Sentinel {
    shared: Arc<Shared>,
    /// One lookup at a time; the others wait and use its master.
    resolving: Mutex<()>,
    /// Whether the event thread was started (with the first lookup), or
    /// is not to be (tests of the client healing by itself).
    watching: Mutex<bool>,
    config: Config,
    trace: ScriptTracer,
    workers: Arc<ScheduledThreadPool>,
    /// Whose user, password, database and TLS settings reach the master.
    master_template: redis::Client,
    /// Which those are, for messages.
    master_settings: &'static str,
    /// The client's grant channel, for each master's hub.
    grants: Option<Arc<Grants>>,
}

/// What the event thread shares with the client.
struct Shared {
    service: String,
    sentinels: Vec<redis::Client>,
    /// For messages: the sentinels' addresses.
    sentinel_addrs: String,
    current: RwLock<Option<Arc<Master>>>,
    generations: AtomicU64,
    /// Told of each `+switch-master` of the service.
    observer: Observer,
}

/// One lookup's master and its pools.
struct Master {
    generation: u64,
    server: Single,
}

impl Shared {
    /// Forgets master `generation` (or whatever master, for `None`), so
    /// that the next exchange looks the master up again.
    fn forget(&self, generation: Option<u64>) {
        let mut current = self.current.write();
        if generation.is_none() || current.as_ref().map(|m| m.generation) == generation {
            *current = None;
        }
    }
}

impl Sentinel {
    /// The master of `service` as `sentinels` know it; `grants`: the
    /// client's grant channel, for each master's hub. Does not connect.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        service: String,
        sentinels: Vec<redis::Client>,
        master: Option<redis::Client>,
        config: &Config,
        trace: ScriptTracer,
        workers: Arc<ScheduledThreadPool>,
        follow_switches: bool,
        grants: Option<Arc<Grants>>,
    ) -> Self {
        let sentinel_addrs = addrs_of(&sentinels);
        let master_settings = match master {
            Some(_) => "the master URL's settings",
            None => "the first sentinel URL's settings",
        };
        let master_template = master.unwrap_or_else(|| sentinels[0].clone());
        Sentinel {
            master_template,
            master_settings,
            grants,
            shared: Arc::new(Shared {
                service,
                sentinels,
                sentinel_addrs,
                current: RwLock::new(None),
                generations: AtomicU64::new(0),
                observer: config.observer.clone(),
            }),
            resolving: Mutex::new(()),
            watching: Mutex::new(!follow_switches),
            config: config.clone(),
            trace,
            workers,
        }
    }

    /// The sentinels, for messages.
    pub(super) fn addr(&self) -> &str {
        &self.shared.sentinel_addrs
    }

    /// Runs one exchange on the master. `READONLY` (the server is no
    /// master any more; the script wrote nothing) sends it once more to
    /// the master looked up afresh.
    pub(super) fn exchange<T>(
        &self,
        name: &str,
        mut exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Sent<T>, Failed> {
        let not_sent = |error| Failed {
            error,
            outcome_unknown: false,
        };
        let mut again = true;
        loop {
            let master = self.master().map_err(not_sent)?;
            let err = match master.server.send(&mut exchange) {
                Ok(sent) => return Ok(sent),
                Err(SendError::NoConnection(error)) => {
                    if error.is_transient() || error.is_timeout() {
                        self.shared.forget(Some(master.generation));
                    }
                    return Err(not_sent(error));
                }
                Err(SendError::Reply(err)) => err,
            };
            let readonly = err.code() == Some("READONLY");
            let failed = master.server.failed(SendError::Reply(err), name);
            if readonly || failed.error.is_transient() {
                self.shared.forget(Some(master.generation));
            }
            if !(readonly && again) {
                return Err(failed);
            }
            again = false;
        }
    }

    /// Whether a release's grant may reach a waiter parked at the current
    /// master (before the first lookup, not yet known: yes).
    pub(super) fn takes_grants(&self) -> bool {
        self.shared
            .current
            .read()
            .as_ref()
            .is_none_or(|master| master.server.takes_grants())
    }

    /// Wakes this client's waiters parked on `list` at the current master.
    pub(super) fn wake_parked(&self, list: &str) -> bool {
        self.shared
            .current
            .read()
            .as_ref()
            .is_some_and(|master| master.server.wake_parked(list))
    }

    /// Parks on the master (watching `watch` there, if given).
    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        how: ParkHow<'_>,
    ) -> Result<Parked, Error> {
        let master = self.master()?;
        let parked = master.server.park(name, list, park, how)?;
        if let Parked::ConnectionFailed(_) = &parked {
            // Killed, or `UNBLOCKED` when it was demoted.
            self.shared.forget(Some(master.generation));
        }
        Ok(parked)
    }

    /// The current master, looked up if there is none.
    fn master(&self) -> Result<Arc<Master>, Error> {
        if let Some(master) = self.shared.current.read().as_ref() {
            return Ok(Arc::clone(master));
        }
        let _one = self.resolving.lock();
        if let Some(master) = self.shared.current.read().as_ref() {
            return Ok(Arc::clone(master));
        }
        let client = self.resolve()?;
        let master = Arc::new(Master {
            generation: self.shared.generations.fetch_add(1, Ordering::Relaxed) + 1,
            server: Single::new(
                client,
                &self.config,
                self.trace,
                &self.workers,
                false,
                self.grants.clone(),
            ),
        });
        log::debug!(
            "redbaton: master of {:?} is {} (lookup {})",
            self.shared.service,
            master.server.addr(),
            master.generation
        );
        *self.shared.current.write() = Some(Arc::clone(&master));
        self.watch();
        Ok(master)
    }

    /// Asks each sentinel in turn for the master, and the master for its
    /// role.
    fn resolve(&self) -> Result<redis::Client, Error> {
        let shared = &self.shared;
        let mut unknown_to = Vec::new();
        let mut last_error = None;
        for sentinel in &shared.sentinels {
            let addr = sentinel.get_connection_info().addr().to_string();
            let found: RedisResult<Option<(String, u16)>> = self.ask(sentinel, |c| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&shared.service)
                    .query(c)
            });
            let (host, port) = match found {
                Ok(Some(found)) => found,
                Ok(None) => {
                    unknown_to.push(addr);
                    continue;
                }
                Err(err) => {
                    last_error = Some(self.sentinel_error(err, &addr));
                    continue;
                }
            };
            let master = self.master_client(&host, port)?;
            let role: RedisResult<Value> = self.ask(&master, |c| redis::cmd("ROLE").query(c));
            if let Err(err) = &role {
                if is_auth_failure(err) {
                    return Err(Error::AuthenticationFailed {
                        addr: format!("{host}:{port}"),
                        detail: format!(
                            "{} (the master of {:?}, reached with {}; give the master's own \
                             user and password with Topology::sentinel_with_master_url)",
                            describe_io(err),
                            shared.service,
                            self.master_settings
                        ),
                        source: None,
                    });
                }
            }
            match role {
                Ok(Value::Array(fields)) if matches!(fields.first(), Some(Value::BulkString(role)) if role == b"master") => {
                    return Ok(master)
                }
                Ok(_) => {
                    last_error = Some(Error::Unavailable {
                        addr: format!("{host}:{port}"),
                        detail: format!(
                            "sentinel {addr} names it master of {:?}, but it is not (a failover \
                             is under way)",
                            shared.service
                        ),
                    })
                }
                Err(err) => last_error = Some(self.sentinel_error(err, &format!("{host}:{port}"))),
            }
        }
        match last_error {
            Some(err) => Err(err),
            None => Err(Error::WrongTopology {
                addr: unknown_to.join(", "),
                detail: format!(
                    "(sentinels) do not know the service {:?}: check its name (SENTINEL MASTERS \
                     lists the ones they monitor)",
                    shared.service
                ),
            }),
        }
    }

    /// One command on a short-lived connection to `client`.
    fn ask<T>(
        &self,
        client: &redis::Client,
        command: impl FnOnce(&mut redis::Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let mut conn = client.get_connection_with_timeout(self.config.io_timeout)?;
        conn.set_read_timeout(Some(self.config.io_timeout))?;
        set_client_name(&mut conn, &self.config.client_name)?;
        command(&mut conn)
    }

    fn sentinel_error(&self, err: redis::RedisError, addr: &str) -> Error {
        if is_auth_failure(&err) {
            return Error::AuthenticationFailed {
                addr: addr.to_owned(),
                detail: format!(
                    "{} (a sentinel: check the user and password in the sentinels' URLs)",
                    describe_io(&err)
                ),
                source: Some(err),
            };
        }
        if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
            && err.code() != Some("READONLY")
        {
            return Error::Redis { source: err };
        }
        Error::Unreachable {
            addr: addr.to_owned(),
            detail: describe_io(&err),
            timed_out: err.is_timeout(),
            source: Some(err),
        }
    }

    /// A client for the master at `host:port`, with the master URL's
    /// user, password, database and TLS settings (by default the first
    /// sentinel URL's).
    fn master_client(&self, host: &str, port: u16) -> Result<redis::Client, Error> {
        client_at(&self.master_template, host, port)
    }

    /// Starts the thread that follows `+switch-master`, once.
    fn watch(&self) {
        let mut watching = self.watching.lock();
        if *watching {
            return;
        }
        let shared = Arc::downgrade(&self.shared);
        let io_timeout = self.config.io_timeout;
        let name = Arc::clone(&self.config.client_name);
        let started = thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || follow_switches(&shared, io_timeout, &name));
        match started {
            Ok(_) => *watching = true,
            // Failovers are still noticed, one failed exchange later.
            Err(err) => log::warn!("redbaton: cannot start the sentinel event thread: {err}"),
        }
    }
}

/// Subscribes to `+switch-master` on one sentinel after another, and
/// forgets the master when the service's master switches. Ends when the
/// client is gone.
fn follow_switches(shared: &Weak<Shared>, io_timeout: Duration, name: &str) {
    let mut next = 0usize;
    loop {
        let Some(client) = shared
            .upgrade()
            .map(|s| s.sentinels[next % s.sentinels.len()].clone())
        else {
            return;
        };
        next += 1;
        match subscribe(shared, &client, io_timeout, name) {
            // The client is gone.
            Ok(()) => return,
            Err(err) => log::debug!(
                "redbaton: sentinel events from {} stopped: {}",
                client.get_connection_info().addr(),
                describe_io(&err)
            ),
        }
        thread::sleep(WATCH_TICK);
    }
}

/// Follows `+switch-master` on one sentinel until the connection fails or
/// the client is gone.
fn subscribe(
    shared: &Weak<Shared>,
    client: &redis::Client,
    io_timeout: Duration,
    name: &str,
) -> RedisResult<()> {
    let mut conn = client.get_connection_with_timeout(io_timeout)?;
    set_client_name(&mut conn, name)?;
    let mut events = conn.as_pubsub();
    events.subscribe("+switch-master")?;
    events.set_read_timeout(Some(WATCH_TICK))?;
    loop {
        let message = match events.get_message() {
            Ok(message) => message,
            Err(err) if err.is_timeout() => {
                if shared.strong_count() == 0 {
                    return Ok(());
                }
                continue;
            }
            Err(err) => return Err(err),
        };
        let Some(shared) = shared.upgrade() else {
            return Ok(());
        };
        // "<service> <old host> <old port> <new host> <new port>"
        let payload: String = message.get_payload().unwrap_or_default();
        if payload.split(' ').next() == Some(shared.service.as_str()) {
            log::info!("redbaton: sentinel reports a new master: {payload}");
            // Any master: a lookup made just before the event may have
            // found the old one.
            shared.forget(None);
            shared.observer.emit(|| Event::MasterSwitched {
                service: &shared.service,
            });
        }
    }
}

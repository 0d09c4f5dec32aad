//! Redis Cluster: every exchange goes to the master that serves its key's
//! slot, over that master's own pools (a [`Single`] per master).
//!
//! redis-rs's cluster connection is not used: it sends a command again
//! after a read timeout (a script that may have run would run twice), opens
//! a socket to every node for each connection (a parked waiter must cost
//! one), and fans `SCRIPT LOAD` and `WAIT` out to every node. Routing here
//! is explicit instead: the slot map comes from `CLUSTER SLOTS`, asked
//! again after `MOVED`, a connection failure or `CLUSTERDOWN` (not after
//! `ASK` or `TRYAGAIN`: a slot migrating between two masters is no change
//! of the map); `MOVED` and `ASK` are followed at once (the command did
//! not run), parks included, and nothing that may have run is sent again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::{ConnectionLike, ErrorKind, RedisResult, ServerErrorKind, Value};
use scheduled_thread_pool::ScheduledThreadPool;

use super::classify::{describe_io, ScriptTracer};
use super::pool::set_client_name;
use super::single::{SendError, Single};
use super::{addrs_of, client_at, slot, Failed, NodeParked, ParkHow, Parked, Sent};
use crate::config::Config;
use crate::error::Error;
use crate::observe::Event;

/// Redirections followed for one exchange before giving up for now (a
/// slot that keeps moving: resharding in progress).
const MAX_REDIRECTS: usize = 5;

/// No master serves the slot in the map.
const UNCOVERED: u16 = u16::MAX;

pub(super) struct Cluster {
    /// Where the map is first asked for (and again when no known master
    /// answers); their user, password and TLS settings serve every node.
    seeds: Vec<redis::Client>,
    config: Config,
    trace: ScriptTracer,
    workers: Arc<ScheduledThreadPool>,
    routes: RwLock<Arc<Routes>>,
    /// One refresh at a time; the others wait and use its map.
    refreshing: Mutex<()>,
    /// Nodes an `ASK` named that the map does not list (a new master
    /// importing its first slots), so that their pools are made once;
    /// a map that lists them takes them over.
    unlisted: Mutex<HashMap<String, Arc<Single>>>,
    /// For messages: the seeds' addresses.
    seed_addrs: String,
}

/// One slot map, with the pools of its masters.
struct Routes {
    /// Counts refreshes, so that a caller that saw an old map asks for a
    /// new one only if nobody did since.
    generation: u64,
    /// Index into `masters` for each slot, or [`UNCOVERED`].
    slots: Vec<u16>,
    masters: Vec<Arc<Single>>,
}

impl Cluster {
    /// A cluster reached first through `seeds`. Does not connect.
    pub(super) fn new(
        seeds: Vec<redis::Client>,
        config: &Config,
        trace: ScriptTracer,
        workers: Arc<ScheduledThreadPool>,
    ) -> Self {
        let seed_addrs = addrs_of(&seeds);
        Cluster {
            seeds,
            config: config.clone(),
            trace,
            workers,
            routes: RwLock::new(Arc::new(Routes {
                generation: 0,
                slots: Vec::new(),
                masters: Vec::new(),
            })),
            refreshing: Mutex::new(()),
            unlisted: Mutex::new(HashMap::new()),
            seed_addrs,
        }
    }

    /// The seeds, for messages.
    pub(super) fn addr(&self) -> &str {
        &self.seed_addrs
    }

    /// The master serving `key`, and the map it was found in.
    fn master_of(&self, key: &str, name: &str) -> Result<(Arc<Single>, u64), Error> {
        let slot = slot::of(key);
        let mut routes = Arc::clone(&self.routes.read());
        if routes.generation == 0 {
            self.refresh(0)?;
            routes = Arc::clone(&self.routes.read());
        }
        match routes.slots[usize::from(slot)] {
            UNCOVERED => Err(Error::WrongTopology {
                addr: self.seed_addrs.clone(),
                detail: format!(
                    "is a Redis Cluster in which no master serves slot {slot} (of {name:?}): \
                     assign every slot (redis-cli --cluster fix)"
                ),
            }),
            index => Ok((
                Arc::clone(&routes.masters[usize::from(index)]),
                routes.generation,
            )),
        }
    }

    /// The pools of the node at `addr` (`host:port`) that a redirection
    /// named: a master of the current map, or a node it does not list yet.
    fn node_at(&self, addr: &str) -> Result<Arc<Single>, Error> {
        let listed = self
            .routes
            .read()
            .masters
            .iter()
            .find(|master| master.addr() == addr)
            .cloned();
        if let Some(master) = listed {
            return Ok(master);
        }
        let mut unlisted = self.unlisted.lock();
        if let Some(node) = unlisted.get(addr) {
            return Ok(Arc::clone(node));
        }
        let node = Arc::new(self.new_node(addr)?);
        unlisted.insert(addr.to_owned(), Arc::clone(&node));
        Ok(node)
    }

    /// Pools for the node at `addr`. Does not connect.
    fn new_node(&self, addr: &str) -> Result<Single, Error> {
        Ok(Single::new(
            self.node_client(addr)?,
            &self.config,
            self.trace,
            &self.workers,
            true,
            None,
        ))
    }

    /// Groups `keys` (by index) by the master that serves them; keys whose
    /// slot is not served come last, alone in their group.
    pub(super) fn shards(&self, keys: &[&str]) -> Vec<Vec<usize>> {
        let routes = Arc::clone(&self.routes.read());
        let mut groups: HashMap<u16, Vec<usize>> = HashMap::new();
        let mut alone = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match routes.slots.get(usize::from(slot::of(key))) {
                Some(&index) if index != UNCOVERED => groups.entry(index).or_default().push(i),
                _ => alone.push(vec![i]),
            }
        }
        groups.into_values().chain(alone).collect()
    }

    /// Runs one exchange for `key` on its master, following redirections.
    pub(super) fn exchange<T>(
        &self,
        key: &str,
        name: &str,
        mut exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Sent<T>, Failed> {
        let not_sent = |error| Failed {
            error,
            outcome_unknown: false,
        };
        // `ASK`: this one exchange goes to the importing node, after
        // `ASKING` on the same connection.
        let mut asking: Option<Arc<Single>> = None;
        for _ in 0..MAX_REDIRECTS {
            let ask = asking.is_some();
            let (node, generation) = match asking.take() {
                // The map that sent us there is the current one, or older.
                Some(node) => (node, self.routes.read().generation),
                None => self.master_of(key, name).map_err(not_sent)?,
            };
            let sent = node.send(|c| {
                if ask {
                    exchange(&mut Asking(c))
                } else {
                    exchange(c)
                }
            });
            let err = match sent {
                Ok(sent) => return Ok(sent),
                Err(SendError::NoConnection(error)) => {
                    if error.is_transient() || error.is_timeout() {
                        self.refresh_quietly(generation);
                    }
                    return Err(not_sent(error));
                }
                Err(SendError::Reply(err)) => err,
            };
            match err.kind() {
                ErrorKind::Server(ServerErrorKind::Moved) => {
                    self.refresh(generation).map_err(not_sent)?;
                }
                ErrorKind::Server(ServerErrorKind::Ask) => {
                    // Not a change of the map: no reload.
                    let target = redirect_target(&err);
                    asking = Some(self.node_at(&target).map_err(not_sent)?);
                }
                kind => {
                    // `TRYAGAIN` (a migrating slot's keys on two nodes) is
                    // no change of the map either, though it is "not now".
                    let try_again = kind == ErrorKind::Server(ServerErrorKind::TryAgain);
                    let moved_on = kind == ErrorKind::Server(ServerErrorKind::ClusterDown);
                    let failed = node.failed(SendError::Reply(err), name);
                    if moved_on || (failed.error.is_transient() && !try_again) {
                        self.refresh_quietly(generation);
                    }
                    return Err(failed);
                }
            }
        }
        Err(not_sent(self.kept_moving(name)))
    }

    /// Runs `exchange` on each master of the slot map (loaded first if
    /// none is yet): see [`Backend::on_every_master`](super::Backend::on_every_master).
    pub(super) fn on_every_master<T>(
        &self,
        name: &str,
        mut exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Vec<T>, Error> {
        if self.routes.read().generation == 0 {
            self.refresh(0)?;
        }
        let routes = Arc::clone(&self.routes.read());
        let mut values = Vec::with_capacity(routes.masters.len());
        for master in &routes.masters {
            let sent = master
                .send(&mut exchange)
                .map_err(|failed| master.failed(failed, name).error)?;
            values.push(sent.value);
        }
        Ok(values)
    }

    /// Wakes this client's waiters parked on `list` at any node (a waiter
    /// parks where the list's slot was served when it parked).
    pub(super) fn wake_parked(&self, list: &str) -> bool {
        let routes = Arc::clone(&self.routes.read());
        routes.masters.iter().any(|node| node.wake_parked(list))
    }

    /// Parks on the node serving `list`: one socket on one node.
    ///
    /// A redirection is followed as a command's is: `ASK` (the list's slot
    /// is migrating and the list is not on the source) parks on the
    /// importing node after `ASKING`, which is where a baton pushed during
    /// the migration lands (a release runs only where all its keys are:
    /// on the source while the baton list is there, on the target once
    /// the lock key has moved); `MOVED` reloads the map (once per park)
    /// and parks on the new owner. Either way the park lasts until its own
    /// end, not one round trip: nodes that keep sending the waiter back and
    /// forth (a migration half set up or half undone) have it wait out the
    /// park without a socket rather than spin.
    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        how: ParkHow<'_>,
    ) -> Result<Parked, Error> {
        let park_until = Instant::now() + park;
        let (mut node, mut generation) = self.master_of(list, name)?;
        let mut asking = false;
        let mut reloaded = false;
        for _ in 0..MAX_REDIRECTS {
            let err = match node.park_node(name, list, park_until, how, asking)? {
                NodeParked::Parked(parked) => {
                    if let Parked::ConnectionFailed(_) = &parked {
                        // Killed, failed over, or `UNBLOCKED` by a demotion.
                        self.refresh_quietly(generation);
                    }
                    return Ok(parked);
                }
                NodeParked::Redirected(err) => err,
            };
            asking = err.kind() == ErrorKind::Server(ServerErrorKind::Ask);
            if !asking && !reloaded {
                // `MOVED`: the map is out of date.
                self.refresh_quietly(generation);
                generation = self.routes.read().generation;
                reloaded = true;
            }
            node = self.node_at(&redirect_target(&err))?;
        }
        log::debug!(
            "redbaton: the slot of {name:?} kept moving ({MAX_REDIRECTS} redirections); waiting \
             out the park"
        );
        std::thread::sleep(park_until.saturating_duration_since(Instant::now()));
        Ok(Parked::Done)
    }

    /// A slot that kept moving while one exchange or park followed it:
    /// not now.
    fn kept_moving(&self, name: &str) -> Error {
        Error::Unavailable {
            addr: self.seed_addrs.clone(),
            detail: format!("the slot of {name:?} kept moving ({MAX_REDIRECTS} redirections)"),
        }
    }

    fn refresh_quietly(&self, seen: u64) {
        if let Err(err) = self.refresh(seen) {
            log::debug!("redbaton: cluster slot map not refreshed: {err}");
        }
    }

    /// Loads the slot map, unless someone did since the caller saw map
    /// `seen`.
    fn refresh(&self, seen: u64) -> Result<(), Error> {
        if self.reload(seen)? {
            // Told once the refresh lock is let go.
            self.config.observer.emit(|| Event::SlotMapReloaded);
        }
        Ok(())
    }

    /// [`refresh`](Cluster::refresh)'s work; true when this call loaded
    /// the map.
    fn reload(&self, seen: u64) -> Result<bool, Error> {
        let _one = self.refreshing.lock();
        let current = Arc::clone(&self.routes.read());
        if current.generation > seen {
            return Ok(false);
        }
        // Known masters first (a seed may be long gone), then the seeds.
        let known = current.masters.iter().map(|master| {
            let addr = master.addr().to_owned();
            self.node_client(&addr)
        });
        let seeds = self.seeds.iter().cloned().map(Ok);
        let mut last_error = None;
        for client in known.chain(seeds) {
            let client = match client {
                Ok(client) => client,
                Err(err) => {
                    last_error = Some(err);
                    continue;
                }
            };
            match self.ask_slots(&client) {
                Ok(map) => {
                    let routes = self.build_routes(&current, map)?;
                    *self.routes.write() = Arc::new(routes);
                    return Ok(true);
                }
                // Not a cluster at all: no other seed will say otherwise.
                Err(err @ Error::WrongTopology { .. }) => return Err(err),
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Unreachable {
            addr: self.seed_addrs.clone(),
            detail: "no cluster node known".to_owned(),
            timed_out: false,
            source: None,
        }))
    }

    /// `CLUSTER SLOTS` of one node: `(first, last, host, port)` per range.
    fn ask_slots(&self, client: &redis::Client) -> Result<Vec<(u16, u16, String, u16)>, Error> {
        let addr = client.get_connection_info().addr().to_string();
        let unreachable = |err: redis::RedisError| Error::Unreachable {
            addr: addr.clone(),
            detail: describe_io(&err),
            timed_out: err.is_timeout(),
            source: Some(err),
        };
        let mut conn = client
            .get_connection_with_timeout(self.config.io_timeout)
            .map_err(unreachable)?;
        conn.set_read_timeout(Some(self.config.io_timeout))
            .map_err(unreachable)?;
        set_client_name(&mut conn, &self.config.client_name).map_err(unreachable)?;
        let reply: Value = match redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn) {
            Ok(reply) => reply,
            Err(err)
                if err
                    .detail()
                    .is_some_and(|d| d.contains("cluster support disabled")) =>
            {
                return Err(Error::WrongTopology {
                    addr,
                    detail: "is not a Redis Cluster node (cluster support disabled): build the \
                             client with Topology::server"
                        .to_owned(),
                })
            }
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) => {
                return Err(Error::Redis { source: err })
            }
            Err(err) => return Err(unreachable(err)),
        };
        let host = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, _) => host.clone(),
            #[cfg(feature = "tls")]
            redis::ConnectionAddr::TcpTls { host, .. } => host.clone(),
            _ => String::new(),
        };
        slot::parse_map(reply, &host).ok_or_else(|| Error::WrongTopology {
            addr,
            detail: "answered CLUSTER SLOTS with a reply redbaton cannot read".to_owned(),
        })
    }

    /// A map from `CLUSTER SLOTS` ranges, reusing the pools of masters
    /// already known.
    fn build_routes(
        &self,
        current: &Routes,
        ranges: Vec<(u16, u16, String, u16)>,
    ) -> Result<Routes, Error> {
        let mut slots = vec![UNCOVERED; slot::SLOTS];
        let mut masters: Vec<Arc<Single>> = Vec::new();
        for (first, last, host, port) in ranges {
            let addr = format!("{host}:{port}");
            let index = match masters.iter().position(|m| m.addr() == addr) {
                Some(index) => index,
                None => {
                    let known = current.masters.iter().find(|m| m.addr() == addr).cloned();
                    let master = match known.or_else(|| self.unlisted.lock().remove(&addr)) {
                        Some(master) => master,
                        None => Arc::new(self.new_node(&addr)?),
                    };
                    masters.push(master);
                    masters.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(UNCOVERED);
            for slot in first..=last.min(slot::SLOTS as u16 - 1) {
                slots[usize::from(slot)] = index;
            }
        }
        log::debug!(
            "redbaton: cluster slot map {} with {} masters",
            current.generation + 1,
            masters.len()
        );
        Ok(Routes {
            generation: current.generation + 1,
            slots,
            masters,
        })
    }

    /// A client for the node at `addr` (`host:port`), with the first
    /// seed's user, password, database and TLS settings.
    fn node_client(&self, addr: &str) -> Result<redis::Client, Error> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| Error::WrongTopology {
                addr: addr.to_owned(),
                detail: "is a node address redbaton cannot read".to_owned(),
            })?;
        client_at(&self.seeds[0], host, port)
    }
}

/// A connection that sends `ASKING` before each command (in the same
/// write), for an exchange that an `ASK` sent to the importing node:
/// `ASKING` holds for one command only, and an exchange may send several
/// (a script's `EVALSHA`, and after `NOSCRIPT` its `SCRIPT LOAD` and
/// `EVALSHA` again). A pipeline gets one `ASKING` in front, which covers a
/// `MULTI` block or a pipeline whose first command alone names a key.
struct Asking<'a>(&'a mut dyn ConnectionLike);

impl Asking<'_> {
    fn asking(cmd: &[u8]) -> Vec<u8> {
        let mut packed = redis::cmd("ASKING").get_packed_command();
        packed.extend_from_slice(cmd);
        packed
    }
}

impl ConnectionLike for Asking<'_> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        let mut replies = self.0.req_packed_commands(&Asking::asking(cmd), 1, 1)?;
        Ok(replies.pop().unwrap_or(Value::Nil))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.0
            .req_packed_commands(&Asking::asking(cmd), offset + 1, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.0.check_connection()
    }

    fn is_open(&self) -> bool {
        self.0.is_open()
    }
}

/// The `host:port` a `MOVED` or `ASK` names (empty if it names none,
/// which Redis never does: an address redbaton cannot read).
fn redirect_target(err: &redis::RedisError) -> String {
    err.redirect_node()
        .map(|(addr, _)| addr.to_owned())
        .unwrap_or_default()
}

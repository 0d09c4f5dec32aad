//! Everything that opens sockets, and nothing that knows what a lock is.
//!
//! A [`Backend`] carries short exchanges (a script call, a pipeline) and
//! parks waiters in `BLPOP`, for a caller that names the key it works on.
//! Connection pooling, the classification of transport errors and the
//! rules for parked connections live here, once. The flavors:
//!
//! - `single`: one Redis server (a command pool and a parking pool);
//! - `cluster` (feature `cluster`): a `single` per master of a Redis
//!   Cluster, chosen by the slot of the key an exchange names (`slot`);
//! - `sentinel` (feature `sentinel`): a `single` for the master the
//!   sentinels name, made anew after each failover;
//! - `quorum` (feature `redlock`): a `Backend` per independent master, for
//!   a Redlock quorum that fans out to them; parks on one at a time.
//!
//! `unblock` ends parks on time (`CLIENT UNBLOCK`) rather than on the
//! server's timer tick; every flavor uses it, on the node it parks on.
//! Each flavor is a file of this folder, with one-line dispatch in
//! [`Backend`]'s methods.

mod classify;
#[cfg(feature = "cluster")]
mod cluster;
mod pool;
#[cfg(feature = "redlock")]
mod quorum;
#[cfg(feature = "sentinel")]
mod sentinel;
mod single;
#[cfg(feature = "cluster")]
mod slot;
mod unblock;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionLike, RedisResult};

use crate::config::Config;
use crate::error::Error;

pub(crate) use classify::{is_transient_reply, ScriptTracer};

/// Where a client's commands go.
pub(crate) struct Backend {
    flavor: Flavor,
    /// The process that opened it: a forked child inherits the sockets,
    /// which it must not use.
    pid: u32,
}

enum Flavor {
    Single(single::Single),
    #[cfg(feature = "cluster")]
    Cluster(cluster::Cluster),
    #[cfg(feature = "sentinel")]
    Sentinel(sentinel::Sentinel),
    #[cfg(feature = "redlock")]
    Quorum(quorum::Quorum),
}

/// A successful exchange.
#[derive(Debug)]
pub(crate) struct Sent<T> {
    pub(crate) value: T,
    /// The first send failed on a dropped connection and this is the reply
    /// to the second: the first may have run too.
    pub(crate) resent: bool,
}

/// A failed exchange.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: Error,
    /// The command may have reached Redis and run, with its reply lost (a
    /// timeout or a dropped connection after sending).
    pub(crate) outcome_unknown: bool,
}

/// How one park ended.
#[derive(Debug)]
pub(crate) enum Parked {
    /// Woken by a token or by the park's timeout.
    Done,
    /// The parked connection failed; it was closed.
    ConnectionFailed(Error),
}

impl Backend {
    /// One server at `client`'s address. Does not connect.
    pub(crate) fn single(client: redis::Client, config: &Config, trace: ScriptTracer) -> Backend {
        let workers = single::connect_workers();
        Backend::with(Flavor::Single(single::Single::new(
            client, config, trace, &workers,
        )))
    }

    /// A Redis Cluster first reached through `seeds`. Does not connect.
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(
        seeds: Vec<redis::Client>,
        config: &Config,
        trace: ScriptTracer,
    ) -> Backend {
        let workers = single::connect_workers();
        Backend::with(Flavor::Cluster(cluster::Cluster::new(
            seeds, config, trace, workers,
        )))
    }

    /// The master of `service` as `sentinels` know it. Does not connect.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(
        service: String,
        sentinels: Vec<redis::Client>,
        config: &Config,
        trace: ScriptTracer,
    ) -> Backend {
        let workers = single::connect_workers();
        Backend::with(Flavor::Sentinel(sentinel::Sentinel::new(
            service, sentinels, config, trace, workers,
        )))
    }

    /// Independent masters for a Redlock quorum, each already a backend of
    /// its own. Does not connect.
    #[cfg(feature = "redlock")]
    pub(crate) fn quorum(masters: Vec<Arc<Backend>>) -> Backend {
        Backend::with(Flavor::Quorum(quorum::Quorum::new(masters)))
    }

    /// The masters of a quorum; `None` for every other flavor.
    pub(crate) fn masters(&self) -> Option<&[Arc<Backend>]> {
        match &self.flavor {
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => Some(quorum.masters()),
            _ => None,
        }
    }

    fn with(flavor: Flavor) -> Backend {
        Backend {
            flavor,
            pid: std::process::id(),
        }
    }

    /// Refuses to be used from a process forked from the one that made it.
    pub(crate) fn check_process(&self) -> Result<(), Error> {
        let current = std::process::id();
        if current == self.pid {
            return Ok(());
        }
        Err(Error::ForkedProcess {
            parent: self.pid,
            current,
        })
    }

    /// `host:port` of the server (or the seeds, or the sentinels), for
    /// messages (never a password).
    pub(crate) fn addr(&self) -> &str {
        match &self.flavor {
            Flavor::Single(single) => single.addr(),
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.addr(),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => sentinel.addr(),
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.addr(),
        }
    }

    /// Runs one exchange that works on `key` (every key it names shares
    /// that key's cluster slot) for the object `name` (for error
    /// messages), on a command connection of the server that holds `key`.
    /// A connection found dropped is replaced and the exchange sent once
    /// more (every exchange of this crate is safe to send twice;
    /// [`Sent::resent`] tells the caller); a timeout is not. A cluster
    /// redirection is followed (the command did not run).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) fn exchange<T>(
        &self,
        key: &str,
        name: &str,
        exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Sent<T>, Failed> {
        self.check_process().map_err(|error| Failed {
            error,
            outcome_unknown: false,
        })?;
        match &self.flavor {
            Flavor::Single(single) => single.exchange(name, exchange),
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.exchange(key, name, exchange),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => sentinel.exchange(name, exchange),
            // Only objects of one deployment (a rate limiter) get here.
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => Err(Failed {
                error: Error::WrongTopology {
                    addr: quorum.addr().to_owned(),
                    detail: format!(
                        "(independent masters of a Redlock quorum) hold locks only; {name:?} needs \
                         one deployment: make another client for it"
                    ),
                },
                outcome_unknown: false,
            }),
        }
    }

    /// [`Backend::exchange`] for callers that only need the value.
    pub(crate) fn run<T>(
        &self,
        key: &str,
        name: &str,
        exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T, Error> {
        self.exchange(key, name, exchange)
            .map(|sent| sent.value)
            .map_err(|failed| failed.error)
    }

    /// Sends `packed[i]` to `servers[i]` (single servers) all at once, then
    /// reads every reply, each within its server's I/O timeout: a round
    /// costs the slowest round trip, not their sum, and takes no thread.
    /// Nothing is sent twice: a failure is that server's result.
    #[cfg(feature = "redlock")]
    pub(crate) fn send_all(
        servers: &[Arc<Backend>],
        name: &str,
        packed: &[Vec<u8>],
    ) -> Vec<Result<redis::Value, Failed>> {
        let started = std::time::Instant::now();
        let pending: Vec<_> = servers
            .iter()
            .zip(packed)
            .map(|(server, packed)| {
                server.check_process().map_err(|error| Failed {
                    error,
                    outcome_unknown: false,
                })?;
                match &server.flavor {
                    Flavor::Single(single) => single
                        .begin(packed)
                        .map(|conn| (single, conn))
                        .map_err(|err| single.failed(err, name)),
                    _ => Err(Failed {
                        error: Error::WrongTopology {
                            addr: server.addr().to_owned(),
                            detail: "is not a single server".to_owned(),
                        },
                        outcome_unknown: false,
                    }),
                }
            })
            .collect();
        pending
            .into_iter()
            .map(|sent| {
                let (single, mut conn) = sent?;
                single
                    .finish(&mut conn, started + single.io_timeout())
                    .map_err(|err| single.failed(err, name))
            })
            .collect()
    }

    /// Groups `keys` (by index) so that each group's keys live on one
    /// server, for pipelines that span many objects. One group, except on
    /// a cluster.
    pub(crate) fn shards(&self, keys: &[&str]) -> Vec<Vec<usize>> {
        match &self.flavor {
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.shards(keys),
            _ => vec![(0..keys.len()).collect()],
        }
    }

    /// Tells a cluster that a command was redirected where the exchange
    /// could not see it (inside a pipeline): its slot map is stale.
    pub(crate) fn redirected(&self) {
        #[cfg(feature = "cluster")]
        if let Flavor::Cluster(cluster) = &self.flavor {
            cluster.redirected();
        }
    }

    /// Parks in `BLPOP` on `list` for at most `park`, on a parking
    /// connection (never one a releasing holder needs). Whether a token
    /// came does not matter to the caller: either way it looks again. A
    /// `precise` park is ended on time by the client's timer, at the cost
    /// of one command; the others end on the server's timer tick.
    pub(crate) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        precise: bool,
    ) -> Result<Parked, Error> {
        self.check_process()?;
        match &self.flavor {
            Flavor::Single(single) => single.park(name, list, park, precise),
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.park(name, list, park, precise),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => sentinel.park(name, list, park, precise),
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.park(name, list, park, precise),
        }
    }
}

/// A client for the server at `host:port` with `template`'s user,
/// password, database and TLS settings: a node the cluster announced, the
/// master the sentinels named.
#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn client_at(template: &redis::Client, host: &str, port: u16) -> Result<redis::Client, Error> {
    let info = template.get_connection_info();
    let addr = match info.addr() {
        #[cfg(feature = "tls")]
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
    };
    redis::Client::open(info.clone().set_addr(addr)).map_err(|source| Error::InvalidUrl { source })
}

/// `host:port` of each client, for messages (never a password).
#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn addrs_of(clients: &[redis::Client]) -> String {
    clients
        .iter()
        .map(|client| client.get_connection_info().addr().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flavor = match &self.flavor {
            Flavor::Single(_) => "Single",
            #[cfg(feature = "cluster")]
            Flavor::Cluster(_) => "Cluster",
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(_) => "Sentinel",
            #[cfg(feature = "redlock")]
            Flavor::Quorum(_) => "Quorum",
        };
        f.debug_tuple(flavor).field(&self.addr()).finish()
    }
}

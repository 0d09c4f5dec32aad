//! Everything that opens sockets, and nothing that knows what a lock is.
//!
//! A [`Backend`] carries short exchanges (a script call, a pipeline) and
//! parks waiters until a baton list changes, for a caller that names the
//! key it works on.
//! Connection pooling, the classification of transport errors and the
//! rules for parked connections live here, once. The flavors:
//!
//! - `single`: one Redis server (a command pool and a parking pool; its
//!   waiters park through `hub`, two connections woken by the server's
//!   announcements of changed baton lists, or in `BLPOP` on a parking
//!   connection each where the server refuses those);
//! - `cluster` (feature `cluster`): a `single` per master of a Redis
//!   Cluster, chosen by the slot of the key an exchange names (`slot`);
//! - `sentinel` (feature `sentinel`): a `single` for the master the
//!   sentinels name, made anew after each failover;
//! - `quorum` (feature `redlock`): a `Backend` per independent master, for
//!   a Redlock quorum: sends a round to all of them at once, leaves out
//!   those that stopped answering until a probe hears them; parks on one
//!   at a time.
//!
//! `unblock` ends parks in `BLPOP` on time (`CLIENT UNBLOCK`) rather than
//! on the server's timer tick (the hub's waiters keep their own time).
//! Each flavor is a file of this folder, with one-line dispatch in
//! [`Backend`]'s methods.

mod classify;
#[cfg(feature = "cluster")]
mod cluster;
mod give_backs;
mod grants;
mod hub;
mod pool;
#[cfg(feature = "redlock")]
mod quorum;
#[cfg(feature = "sentinel")]
mod sentinel;
mod single;
#[cfg(feature = "cluster")]
mod slot;
mod unblock;
mod version;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionLike, RedisResult};

use crate::config::Config;
use crate::error::Error;

pub(crate) use classify::{is_transient_reply, ScriptTracer};
pub(crate) use grants::{ticket, Grants, Unclaimed};
pub(crate) use pool::answered_by;

/// Where a client's commands go.
pub(crate) struct Backend {
    flavor: Flavor,
    /// The process that opened it: a forked child inherits the sockets,
    /// which it must not use.
    pid: u32,
    /// The client's grant channel, where the deployment allows grants.
    grants: Option<Arc<Grants>>,
}

// One per client, made once and kept behind an `Arc`: its size does not
// matter, and which variant is the largest depends on the features on.
#[allow(clippy::large_enum_variant)]
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

/// How a waiter parks, besides on which list and for how long.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ParkHow<'a> {
    /// Ended on time by the client's timer; the others may last up to the
    /// server's timer tick longer, as a blocked call's did.
    pub(crate) precise: bool,
    /// A key whose absence means the object is free, checked by the
    /// parking sweeper within `max_park` where [`Backend::watches`] says
    /// so (elsewhere ignored).
    pub(crate) watch: Option<&'a str>,
    /// Leave the tokens on the list now to the other waiters: this
    /// waiter's attempt has just passed them on, and its own look, on its
    /// way at once, would take them back before theirs (which waits for
    /// the server's announcement). It takes one only once the list has
    /// changed since (where a hub parks it; a blocked call takes one at
    /// once).
    pub(crate) after_change: bool,
    /// The waiter's next attempt takes the list's token itself (its
    /// acquire script pops it): where a hub parks it, an
    /// announcement that the list changed ends its park at once
    /// ([`Parked::Rang`]), without the look that would pop the token for
    /// it, so a hand-off waits for one round trip less.
    pub(crate) claims: bool,
    /// Where a hub parks the waiter and its client has a grant channel
    /// (see `grants`): the waiter's ticket (the owner a release may grant
    /// to, and the request its park follows), which a grant's message
    /// names to end its park with [`Parked::Granted`].
    pub(crate) ticket: Option<&'a str>,
}

/// How one park ended.
#[derive(Debug)]
pub(crate) enum Parked {
    /// Woken by a token or by the park's timeout.
    Done,
    /// The list changed (a claiming waiter's park, see
    /// [`ParkHow::claims`]): a token may be there, for the waiter's next
    /// attempt to take.
    Rang,
    /// The parked connection failed; it was closed.
    ConnectionFailed(Error),
    /// A release granted the waiter (its [`ParkHow::ticket`]) what it
    /// waits for.
    Granted(GrantReceipt),
}

/// What a grant brought the parked waiter it named (see `grants`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrantReceipt {
    /// The token of the ownership granted.
    pub(crate) token: u64,
    /// What the grant passed along with it, as the synchronizer's script
    /// wrote it (a fair lock's line of the waiter's client's threads
    /// behind it, see `lib/grant.lua`; the end of the permits' lease, see
    /// the semaphore's `release.lua`).
    pub(crate) behind: Box<str>,
}

/// How a park on one node ended, before a flavor that routes acts on a
/// redirection.
#[derive(Debug)]
enum NodeParked {
    /// Parked (or could not), as the caller sees it.
    Parked(Parked),
    /// `MOVED` or `ASK`: another node serves the list, for good or for
    /// this one command; the park did not block.
    Redirected(redis::RedisError),
}

impl Backend {
    /// One server at `client`'s address. Does not connect.
    /// `grants`: the client's grant channel, where releases may grant
    /// this server's waiters what they wait for (see `grants`).
    pub(crate) fn single(
        client: redis::Client,
        config: &Config,
        trace: ScriptTracer,
        grants: Option<Arc<Grants>>,
    ) -> Backend {
        let workers = single::connect_workers();
        let single = single::Single::new(client, config, trace, &workers, false, grants.clone());
        Backend::with(Flavor::Single(single), grants)
    }

    /// A Redis Cluster first reached through `seeds`. Does not connect.
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(
        seeds: Vec<redis::Client>,
        config: &Config,
        trace: ScriptTracer,
    ) -> Backend {
        let workers = single::connect_workers();
        // A node's publish reaches its own subscribers only: no grants.
        let cluster = cluster::Cluster::new(seeds, config, trace, workers);
        Backend::with(Flavor::Cluster(cluster), None)
    }

    /// The master of `service` as `sentinels` know it, reached with
    /// `master`'s settings (`None`: the first sentinel's), following
    /// `+switch-master` unless `follow_switches` is off (tests only). Does
    /// not connect.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(
        service: String,
        sentinels: Vec<redis::Client>,
        master: Option<redis::Client>,
        config: &Config,
        trace: ScriptTracer,
        follow_switches: bool,
        grants: Option<Arc<Grants>>,
    ) -> Backend {
        let workers = single::connect_workers();
        let sentinel = sentinel::Sentinel::new(
            service,
            sentinels,
            master,
            config,
            trace,
            workers,
            follow_switches,
            grants.clone(),
        );
        Backend::with(Flavor::Sentinel(sentinel), grants)
    }

    /// Independent masters for a Redlock quorum, each already a backend of
    /// its own. Does not connect.
    #[cfg(feature = "redlock")]
    pub(crate) fn quorum(config: &Config, masters: Vec<Arc<Backend>>) -> Backend {
        let observer = config.observer.clone();
        // A grant would be one master's: none.
        Backend::with(Flavor::Quorum(quorum::Quorum::new(masters, observer)), None)
    }

    /// The masters of a quorum; `None` for every other flavor.
    pub(crate) fn masters(&self) -> Option<&[Arc<Backend>]> {
        match &self.flavor {
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => Some(quorum.masters()),
            _ => None,
        }
    }

    /// For a quorum: whether master `index` (its place in
    /// [`Backend::masters`]) is left out of rounds until its probe finds
    /// it answering. False for every other flavor.
    #[cfg(feature = "redlock")]
    pub(crate) fn is_suspect(&self, index: usize) -> bool {
        match &self.flavor {
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.is_suspect(index),
            _ => {
                let _ = index;
                false
            }
        }
    }

    /// For a quorum: where the calling thread's next park should go, a
    /// master (by its place in [`Backend::masters`]) on which its last
    /// round found the lock held, or `None` for the quorum's usual parking
    /// master. Nothing for every other flavor.
    #[cfg(feature = "redlock")]
    pub(crate) fn prefer_parking(&self, master: Option<usize>) {
        match &self.flavor {
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.prefer_parking(master),
            _ => {
                let _ = master;
            }
        }
    }

    fn with(flavor: Flavor, grants: Option<Arc<Grants>>) -> Backend {
        Backend {
            flavor,
            pid: std::process::id(),
            grants,
        }
    }

    /// The client's grant channel, where this deployment allows grants
    /// (see `grants`).
    pub(crate) fn grants(&self) -> Option<&Arc<Grants>> {
        self.grants.as_ref()
    }

    /// Whether a release's grant may reach a waiter of this client parked
    /// now: the deployment allows grants, and the server has refused
    /// neither the parking hub nor the grant channel. A waiter that could
    /// not be reached is not offered one: the release's failed grant (a
    /// token drawn, a message nobody hears) would only slow its hand-off.
    pub(crate) fn takes_grants(&self) -> bool {
        if self.grants.is_none() {
            return false;
        }
        match &self.flavor {
            Flavor::Single(single) => single.takes_grants(),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => sentinel.takes_grants(),
            #[allow(unreachable_patterns)]
            _ => false,
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

    /// Runs `exchange` once on every server that holds keys: the server,
    /// the master the sentinels name, each master of a cluster's slot map,
    /// each master of a quorum. One value per server; the first failure
    /// ends it (`name`: the object named in its message). Not resent: an
    /// exchange here only reads, for an operator's listing.
    pub(crate) fn on_every_master<T>(
        &self,
        name: &str,
        mut exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Vec<T>, Error> {
        self.each_master(name, &mut exchange)
    }

    /// [`Backend::on_every_master`] with the exchange behind one pointer
    /// type, so that a quorum's call for each master is the same function.
    fn each_master<T>(
        &self,
        name: &str,
        exchange: &mut dyn FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Vec<T>, Error> {
        self.check_process()?;
        match &self.flavor {
            Flavor::Single(single) => Ok(vec![
                single
                    .exchange(name, exchange)
                    .map_err(|failed| failed.error)?
                    .value,
            ]),
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.on_every_master(name, exchange),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => Ok(vec![
                sentinel
                    .exchange(name, exchange)
                    .map_err(|failed| failed.error)?
                    .value,
            ]),
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => {
                let mut values = Vec::new();
                for master in quorum.masters() {
                    values.extend(master.each_master(name, exchange)?);
                }
                Ok(values)
            }
        }
    }

    /// Sends `packed` to the masters of a quorum at once, then reads
    /// every reply, each within `timeout` of the start: a round costs the
    /// slowest answering master, never one timeout per master that does
    /// not answer. A master that stopped answering is left out (its result
    /// an [`Error::Unreachable`]) while the others make a majority, and
    /// probed in the background until it answers. Nothing is sent twice:
    /// a failure is that master's result. One result per master, in the
    /// order of [`Backend::masters`]; for any other flavor, one error.
    /// `only`: the masters to send it to (all: `None`); the others' results
    /// are errors that nothing was sent.
    #[cfg(feature = "redlock")]
    pub(crate) fn send_to(
        &self,
        name: &str,
        packed: &[u8],
        timeout: Duration,
        only: Option<&[bool]>,
    ) -> Vec<Result<redis::Value, Failed>> {
        match &self.flavor {
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.send_to(name, packed, timeout, only),
            _ => {
                let _ = (name, packed, timeout, only);
                vec![Err(Failed {
                    error: Error::WrongTopology {
                        addr: self.addr().to_owned(),
                        detail: "is not a quorum of masters".to_owned(),
                    },
                    outcome_unknown: false,
                })]
            }
        }
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

    /// Groups `keys` (by index) by cluster slot, groups in slot order and
    /// each group in the order of `keys`, for scripts over several objects
    /// (a script's keys must share one slot). One group on one server,
    /// Sentinel and a quorum (whose every master holds every key: one
    /// round of one script per master takes them all).
    pub(crate) fn slot_groups(&self, keys: &[&str]) -> Vec<Vec<usize>> {
        match &self.flavor {
            #[cfg(feature = "cluster")]
            Flavor::Cluster(_) => {
                let mut groups = std::collections::BTreeMap::<u16, Vec<usize>>::new();
                for (index, key) in keys.iter().enumerate() {
                    groups.entry(slot::of(key)).or_default().push(index);
                }
                groups.into_values().collect()
            }
            _ => vec![(0..keys.len()).collect()],
        }
    }

    /// Whether a parked waiter's watch key is checked for it (one server,
    /// Sentinel and each node of a Cluster, whose parking hubs sweep them),
    /// so that it may park longer than `max_park` without a lost wake-up
    /// costing more than `max_park`. A Redlock quorum's waiter must come
    /// back to find a majority free.
    pub(crate) fn watches(&self) -> bool {
        match &self.flavor {
            Flavor::Single(_) => true,
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(_) => true,
            #[cfg(feature = "cluster")]
            Flavor::Cluster(_) => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Ends the park of this client's waiters parked on `list`, as a token
    /// pushed there would, with no command; whether any was parked (else
    /// the caller pushes the token). For a waiter of this process that a
    /// release names (a fair lock's next waiter).
    pub(crate) fn wake_parked(&self, list: &str) -> bool {
        match &self.flavor {
            Flavor::Single(single) => single.wake_parked(list),
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.wake_parked(list),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => sentinel.wake_parked(list),
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.wake_parked(list),
        }
    }

    /// Parks until a token of `list` comes, for at most `park`, on a
    /// parking connection (never one a releasing holder needs), as `how`
    /// says. Whether a token came does not matter to the caller: either
    /// way it looks again.
    pub(crate) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        how: ParkHow<'_>,
    ) -> Result<Parked, Error> {
        self.check_process()?;
        match &self.flavor {
            Flavor::Single(single) => single.park(name, list, park, how),
            #[cfg(feature = "cluster")]
            Flavor::Cluster(cluster) => cluster.park(name, list, park, how),
            #[cfg(feature = "sentinel")]
            Flavor::Sentinel(sentinel) => sentinel.park(name, list, park, how),
            #[cfg(feature = "redlock")]
            Flavor::Quorum(quorum) => quorum.park(name, list, park, how),
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

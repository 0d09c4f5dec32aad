//! Everything that opens sockets, and nothing that knows what a lock is.
//!
//! A [`Backend`] carries short exchanges (a script call, a pipeline) and
//! parks waiters in `BLPOP`, for a caller that names the key it works on.
//! Connection pooling, the classification of transport errors and the
//! rules for parked connections live here, once. The flavors:
//!
//! - `single`: one Redis server (a command pool and a parking pool).
//!
//! `unblock` ends parks on time (`CLIENT UNBLOCK`) rather than on the
//! server's timer tick; every flavor uses it.
//!
//! Redis Cluster and Sentinel come as further flavors of the private
//! `Flavor` enum, each a file of this folder, with one-line dispatch in
//! [`Backend`]'s methods.

mod classify;
mod pool;
mod single;
mod unblock;

use std::fmt;
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
        Backend {
            flavor: Flavor::Single(single::Single::new(client, config, trace)),
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

    /// `host:port` of the server, for messages (never a password).
    pub(crate) fn addr(&self) -> &str {
        match &self.flavor {
            Flavor::Single(single) => single.addr(),
        }
    }

    /// Runs one exchange for the object `name` (for error messages) on a
    /// command connection. A connection found dropped is replaced and the
    /// exchange sent once more (every exchange of this crate is safe to
    /// send twice; [`Sent::resent`] tells the caller); a timeout is not.
    pub(crate) fn exchange<T>(
        &self,
        name: &str,
        exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<Sent<T>, Failed> {
        self.check_process().map_err(|error| Failed {
            error,
            outcome_unknown: false,
        })?;
        match &self.flavor {
            Flavor::Single(single) => single.exchange(name, exchange),
        }
    }

    /// [`Backend::exchange`] for callers that only need the value.
    pub(crate) fn run<T>(
        &self,
        name: &str,
        exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T, Error> {
        self.exchange(name, exchange)
            .map(|sent| sent.value)
            .map_err(|failed| failed.error)
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
        }
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flavor = match &self.flavor {
            Flavor::Single(_) => "Single",
        };
        f.debug_tuple(flavor).field(&self.addr()).finish()
    }
}

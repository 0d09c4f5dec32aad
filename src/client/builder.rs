//! [`ClientBuilder`]: where a client's Redis is, and its settings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;

use super::Client;
use crate::backend::Backend;
use crate::config::Config;
use crate::context::Context;
use crate::error::Error;
use crate::lease::RenewLeases;
use crate::scripts;
use crate::sync::lock::SingleServer;

/// Where a client's Redis is: one server today (a URL); Redis Cluster,
/// Sentinel and several independent masters are to come as further forms.
///
/// A `&str` or `String` is a URL: `redis://[user:password@]host[:port][/db]`
/// (or `rediss://` with the `tls` feature, or `redis+unix:///path`).
pub struct Topology {
    /// Parsed at once, reported by `build`; the URL text itself is not kept,
    /// so no password can end up in `Debug` output.
    server: RedisResult<redis::Client>,
}

impl Topology {
    /// One Redis server at `url`.
    pub fn server(url: &str) -> Topology {
        Topology {
            server: redis::Client::open(url),
        }
    }
}

impl From<&str> for Topology {
    fn from(url: &str) -> Topology {
        Topology::server(url)
    }
}

impl From<String> for Topology {
    fn from(url: String) -> Topology {
        Topology::server(&url)
    }
}

impl From<&String> for Topology {
    fn from(url: &String) -> Topology {
        Topology::server(url)
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.server {
            Ok(client) => f
                .debug_tuple("Server")
                .field(&client.get_connection_info().addr().to_string())
                .finish(),
            Err(_) => f.write_str("Server(<invalid URL>)"),
        }
    }
}

/// Settings of a [`Client`]; every setter documents its default.
///
/// Bad values are reported by [`build`](ClientBuilder::build), not by the
/// setters.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), redbaton::Error> {
/// let client = redbaton::Client::builder("redis://127.0.0.1/")
///     .prefix("billing")
///     .pool_size(4)
///     .default_lease(Duration::from_secs(10))
///     .build()?;
/// # Ok(())
/// # }
/// ```
pub struct ClientBuilder {
    topology: Topology,
    prefix: String,
    pool_size: u32,
    parking_connections: u32,
    default_lease: Duration,
    max_park: Duration,
    io_timeout: Duration,
    baton_ttl: Duration,
    fence_counter_ttl: Duration,
    max_local_handoffs: u32,
}

impl ClientBuilder {
    /// A builder for the Redis deployment `topology` (a URL for one
    /// server), with every setting at its default.
    pub fn new(topology: impl Into<Topology>) -> Self {
        ClientBuilder {
            topology: topology.into(),
            prefix: "redbaton".to_owned(),
            pool_size: 8,
            parking_connections: 16,
            default_lease: Duration::from_secs(30),
            max_park: Duration::from_secs(2),
            io_timeout: Duration::from_secs(3),
            baton_ttl: Duration::from_secs(5),
            fence_counter_ttl: Duration::from_secs(24 * 3600),
            max_local_handoffs: 8,
        }
    }

    /// The first segment of every key, so that several applications can share
    /// one Redis. Must be non-empty and contain no `{` or `}`.
    /// Defaults to `"redbaton"`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How many connections carry lock commands (acquire, release, ...).
    /// Each is held for one round trip only, so a few serve many threads.
    /// Between 1 and 1024. Defaults to 8.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How many connections may be parked in `BLPOP` at once. A process parks
    /// at most one per lock name it is waiting for, however many of its
    /// threads wait; waiters beyond this limit look again every maximum park
    /// time instead. Between 1 and 1024. Defaults to 16.
    pub fn parking_connections(mut self, count: u32) -> Self {
        self.parking_connections = count;
        self
    }

    /// The lease of locks taken without a fixed lease: the watchdog renews
    /// it every third of this while the guard lives, and a holder that dies
    /// frees the lock within this long. At least 1 ms, at most a year.
    /// Defaults to 30 s.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// The longest a waiter sits in one `BLPOP` before it looks at the lock
    /// again. Waiters wake earlier when the holder releases or its lease
    /// ends, so this only bounds the cost of a lost wake-up. Defaults to 2 s.
    pub fn max_park(mut self, max_park: Duration) -> Self {
        self.max_park = max_park;
        self
    }

    /// How long connecting, one command's reply, and waiting for a pooled
    /// connection may each take before the call fails with
    /// [`Error::Unreachable`] or [`Error::PoolTimeout`]. Defaults to 3 s.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    /// How long an unclaimed baton stays in Redis. Too short and a wake-up is
    /// lost on a busy server (waiters then wait up to `max_park`); it never
    /// leaks either way. Defaults to 5 s.
    pub fn baton_ttl(mut self, ttl: Duration) -> Self {
        self.baton_ttl = ttl;
        self
    }

    /// How long a lock's fencing counter stays in Redis after the lock was
    /// last taken. Tokens are never below the server's clock in
    /// microseconds, so a counter that expires (or that Redis loses or rolls
    /// back) starts again above every token issued before, and a name used
    /// once leaves no key behind for longer than this. At least 1 ms, at
    /// most a year. Defaults to 1 day.
    pub fn fence_counter_ttl(mut self, ttl: Duration) -> Self {
        self.fence_counter_ttl = ttl;
        self
    }

    /// Trusts `pem` (one or more PEM certificates) as the root for `rediss://`
    /// connections, for a server whose certificate is not signed by a
    /// system-trusted authority (a private CA, or a self-signed certificate).
    /// Without it, the system's root certificates are used.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: &[u8]) -> Self {
        self.topology.server = self.topology.server.and_then(|client| {
            redis::Client::build_with_tls(
                client.get_connection_info().clone(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.to_vec()),
                },
            )
        });
        self
    }

    /// How many times in a row a releasing thread may hand the lock straight
    /// to a waiting thread of the same client (no baton, no round trip for
    /// the waiter) before it must release it in Redis, where waiters of
    /// other processes get their turn. 0 turns local hand-off off; at most
    /// 1,000,000. Defaults to 8.
    pub fn max_local_handoffs(mut self, count: u32) -> Self {
        self.max_local_handoffs = count;
        self
    }

    /// Checks the settings and makes the client. Does not connect.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL that does not parse,
    /// [`Error::InvalidLease`] for a default lease under 1 ms or over a year,
    /// [`Error::InvalidConfig`] for any other setting out of range.
    pub fn build(self) -> Result<Client, Error> {
        let server = self
            .topology
            .server
            .map_err(|source| Error::InvalidUrl { source })?;
        let config = Config {
            prefix: self.prefix,
            pool_size: self.pool_size,
            parking_connections: self.parking_connections,
            default_lease: self.default_lease,
            max_park: self.max_park,
            io_timeout: self.io_timeout,
            baton_ttl: self.baton_ttl,
            fence_ttl: self.fence_counter_ttl,
            max_local_handoffs: self.max_local_handoffs,
        };
        config.validate()?;
        let backend = Arc::new(Backend::single(server, &config, scripts::command_in_error));
        let lock_raw: Arc<SingleServer> =
            Arc::new(SingleServer::new(Arc::clone(&backend), config.baton_ttl));
        let context = Context::new(
            config,
            backend,
            Arc::clone(&lock_raw) as Arc<dyn RenewLeases>,
        );
        Ok(Client::new(Arc::new(context), lock_raw))
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("topology", &self.topology)
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("parking_connections", &self.parking_connections)
            .field("default_lease", &self.default_lease)
            .field("max_park", &self.max_park)
            .field("io_timeout", &self.io_timeout)
            .field("baton_ttl", &self.baton_ttl)
            .field("fence_counter_ttl", &self.fence_counter_ttl)
            .field("max_local_handoffs", &self.max_local_handoffs)
            .finish()
    }
}

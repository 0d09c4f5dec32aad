//! The client's settings, checked once: every setting is stored here and
//! nowhere else, and every limit of the crate is named here.

use std::time::Duration;

use crate::error::Error;

/// The longest lease (and the longest of every other duration setting):
/// one year. Longer is almost surely a unit mistake, and a lock that
/// outlives its holder that long is a stuck lock.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// How many connections a pool may have. r2d2 reserves room for all of
/// them up front, so an absurd size would abort the process; a Redis serves
/// 10,000 clients by default, shared by every process.
const CONNECTIONS: std::ops::RangeInclusive<u32> = 1..=1024;

/// How many local hand-offs in a row may be allowed (0: none).
const HANDOFFS: std::ops::RangeInclusive<u32> = 0..=1_000_000;

/// Settings of one client, as validated by [`Config::validate`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// First segment of every key; non-empty, no braces.
    pub(crate) prefix: String,
    /// Connections for short commands.
    pub(crate) pool_size: u32,
    /// Connections that may sit in `BLPOP` at once.
    pub(crate) parking_connections: u32,
    /// Lease of renewed locks.
    pub(crate) default_lease: Duration,
    /// Longest single park in Redis.
    pub(crate) max_park: Duration,
    /// Connect, each reply, and each wait for a pooled connection.
    pub(crate) io_timeout: Duration,
    /// How long an unclaimed baton stays.
    pub(crate) baton_ttl: Duration,
    /// How long a lock's fencing counter stays after its last use.
    pub(crate) fence_ttl: Duration,
    /// Local hand-offs in a row before a release in Redis.
    pub(crate) max_local_handoffs: u32,
    /// Replicas that must confirm each ownership write, if any.
    pub(crate) replica_acks: Option<ReplicaAcks>,
    /// A quorum's bound on one master's answer.
    pub(crate) node_timeout: Duration,
}

/// `replica_acks(replicas, timeout)`: after each write that makes or
/// extends an ownership, the master waits (`WAIT`) until `replicas`
/// replicas have it, at most `timeout`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// How many replica acknowledgements may be asked for.
const REPLICAS: std::ops::RangeInclusive<u32> = 1..=1024;

impl Config {
    /// Checks every setting against its documented range.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        validate_prefix(&self.prefix)?;
        validate_lease(self.default_lease)?;
        for (what, value, range) in [
            ("pool_size", self.pool_size, CONNECTIONS),
            ("parking_connections", self.parking_connections, CONNECTIONS),
            ("max_local_handoffs", self.max_local_handoffs, HANDOFFS),
        ] {
            if !range.contains(&value) {
                return Err(Error::InvalidConfig(format!(
                    "{what} is {value}; it must be between {} and {}",
                    range.start(),
                    range.end()
                )));
            }
        }
        for (what, value) in [
            ("max_park", self.max_park),
            ("io_timeout", self.io_timeout),
            ("baton_ttl", self.baton_ttl),
            ("fence_counter_ttl", self.fence_ttl),
            ("node_timeout", self.node_timeout),
        ] {
            if value < Duration::from_millis(1) || value > MAX_LEASE {
                return Err(Error::InvalidConfig(format!(
                    "{what} is {value:?}; it must be between 1 ms and a year"
                )));
            }
        }
        if let Some(acks) = self.replica_acks {
            if !REPLICAS.contains(&acks.replicas) {
                return Err(Error::InvalidConfig(format!(
                    "replica_acks asks for {} replicas; it must be between {} and {}",
                    acks.replicas,
                    REPLICAS.start(),
                    REPLICAS.end()
                )));
            }
            // The master answers WAIT only after its timeout: the reply
            // must come before the connection's own I/O timeout.
            if acks.timeout < Duration::from_millis(1) || acks.timeout >= self.io_timeout {
                return Err(Error::InvalidConfig(format!(
                    "replica_acks timeout is {:?}; it must be at least 1 ms and shorter than \
                     io_timeout ({:?})",
                    acks.timeout, self.io_timeout
                )));
            }
        }
        Ok(())
    }
}

/// A lease is sent as PEXPIRE milliseconds: at least one, at most a year.
pub(crate) fn validate_lease(lease: Duration) -> Result<(), Error> {
    if lease < Duration::from_millis(1) || lease > MAX_LEASE {
        return Err(Error::InvalidLease { lease });
    }
    Ok(())
}

/// Checks a key prefix: non-empty and brace-free, so that it cannot open a
/// hash tag of its own.
fn validate_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.is_empty() || prefix.contains(['{', '}']) {
        return Err(Error::InvalidConfig(format!(
            "key prefix {prefix:?} must be non-empty and contain no '{{' or '}}'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braced_or_empty_prefixes_are_refused() {
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("app:locks").is_ok());
    }
}

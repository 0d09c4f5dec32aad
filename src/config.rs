//! The client's settings, checked once: every setting is stored here and
//! nowhere else, and every limit of the crate is named here.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::observe::Observer;

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
    /// What every connection calls itself (`CLIENT SETNAME`), so that an
    /// operator can tell whose connections and locks they see.
    pub(crate) client_name: Arc<str>,
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
    /// How long a run of local hand-offs may go on before a release in
    /// Redis.
    pub(crate) max_local_run: Duration,
    /// Replicas that must confirm each ownership write, if any.
    pub(crate) replica_acks: Option<ReplicaAcks>,
    /// A quorum's bound on one master's answer in a round.
    pub(crate) node_timeout: NodeTimeout,
    /// A quorum's allowance for clocks that run at different rates.
    pub(crate) clock_drift: ClockDrift,
    /// Told of what the client does, if a hook was set.
    pub(crate) observer: Observer,
}

/// How long a quorum round waits for each master (connect, pool wait and
/// reply): `node_timeout(d)` as given, or else a share of the lease the
/// round is for, so that a lock with a short lease does not wait as long
/// as one with the client's default lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeTimeout {
    /// Set with `node_timeout(d)`: the same for every lease.
    pub(crate) fixed: Option<Duration>,
    /// The longest a share of the lease may be.
    pub(crate) io_timeout: Duration,
}

impl NodeTimeout {
    /// The least a share of the lease may be: a master's round trip
    /// under load, and a connect.
    pub(crate) const FLOOR: Duration = Duration::from_millis(50);

    /// The bound for a round about an ownership of `lease`: the fixed
    /// one, or 1 % of the lease, at least [`NodeTimeout::FLOOR`] and at
    /// most the I/O timeout.
    pub(crate) fn for_lease(&self, lease: Duration) -> Duration {
        self.fixed
            .unwrap_or_else(|| (lease / 100).max(Self::FLOOR).min(self.io_timeout))
    }
}

/// `clock_drift(ratio, fixed)`: how much earlier than by this process's
/// clock a lease may end on a master whose clock runs faster, as
/// `ratio × lease + fixed`. Redlock's validity leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClockDrift {
    /// The ratio, in parts per million of the lease.
    pub(crate) per_million: u32,
    /// The fixed part.
    pub(crate) fixed: Duration,
}

/// The largest drift ratio accepted: a lease half eaten by drift is
/// almost surely a unit mistake.
pub(crate) const MAX_DRIFT_RATIO: f64 = 0.5;

impl ClockDrift {
    /// The Redis documentation's allowance: 1 % of the lease + 2 ms.
    pub(crate) const DEFAULT: ClockDrift = ClockDrift {
        per_million: 10_000,
        fixed: Duration::from_millis(2),
    };

    /// `ratio × lease + fixed`, from a ratio given as a float; `None` for
    /// a ratio that is not a number between 0 and [`MAX_DRIFT_RATIO`].
    pub(crate) fn new(ratio: f64, fixed: Duration) -> Option<ClockDrift> {
        if !(0.0..=MAX_DRIFT_RATIO).contains(&ratio) {
            return None;
        }
        Some(ClockDrift {
            // In range, so the product fits (and NaN was refused above).
            per_million: (ratio * 1e6).round() as u32,
            fixed,
        })
    }

    /// The allowance for `lease`. Saturates instead of overflowing.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn allowance(&self, lease: Duration) -> Duration {
        // At most 2^64 s × 10^9 × 5·10^5: far inside a u128.
        let nanos = lease.as_nanos() * u128::from(self.per_million) / 1_000_000;
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        let scaled = Duration::new(secs, (nanos % 1_000_000_000) as u32);
        scaled.saturating_add(self.fixed)
    }
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
    /// How long a fair lock's waiter keeps its place in the queue without
    /// coming back: a waiter comes back at least every `max_park` (plus a
    /// round trip), so a dead one blocks the queue for about one and a
    /// half park slices. The half second on top covers what delays a live
    /// waiter's return besides its park: a park of `max_park` is ended by
    /// the server's timer, up to 1/hz (100 ms at the default `hz`) late,
    /// and a loaded machine schedules the waiter late. (A live waiter that
    /// comes back later still takes its place again at its first arrival.)
    pub(crate) fn place_ttl(&self) -> Duration {
        self.max_park + self.max_park / 2 + Duration::from_millis(500)
    }

    /// Checks every setting against its documented range.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        validate_prefix(&self.prefix)?;
        validate_client_name(&self.client_name)?;
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
            ("max_local_run", self.max_local_run),
            (
                "node_timeout",
                self.node_timeout.for_lease(self.default_lease),
            ),
        ] {
            if value < Duration::from_millis(1) || value > MAX_LEASE {
                return Err(Error::InvalidConfig(format!(
                    "{what} is {value:?}; it must be between 1 ms and a year"
                )));
            }
        }
        if self.clock_drift.fixed > MAX_LEASE {
            return Err(Error::InvalidConfig(format!(
                "clock_drift's fixed part is {:?}; it must be at most a year",
                self.clock_drift.fixed
            )));
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

/// The longest client name taken: far more than a host and a process id
/// need, short enough for `CLIENT LIST` to stay readable.
const MAX_CLIENT_NAME: usize = 128;

/// Checks a connection name as Redis takes it: printable ASCII without
/// spaces, and not too long.
fn validate_client_name(name: &str) -> Result<(), Error> {
    let printable = name.bytes().all(|b| (b'!'..=b'~').contains(&b));
    if name.is_empty() || name.len() > MAX_CLIENT_NAME || !printable {
        return Err(Error::InvalidConfig(format!(
            "client name {name:?} must be 1 to {MAX_CLIENT_NAME} printable ASCII characters \
             without spaces (Redis refuses others in CLIENT SETNAME)"
        )));
    }
    Ok(())
}

/// The client name when none is set: `redbaton:<host>:<pid>`, the host as
/// the system names it, with anything Redis would refuse in a name turned
/// into `-`.
pub(crate) fn default_client_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    let host: String = host
        .chars()
        .take(64)
        .map(|c| if c.is_ascii_graphic() { c } else { '-' })
        .collect();
    format!("redbaton:{host}:{}", std::process::id())
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
    fn the_node_timeout_is_a_share_of_the_lease_at_hand_unless_fixed() {
        let ms = Duration::from_millis;
        let share = NodeTimeout {
            fixed: None,
            io_timeout: ms(3000),
        };
        assert_eq!(share.for_lease(ms(30_000)), ms(300));
        assert_eq!(share.for_lease(ms(1000)), ms(50), "at least 50 ms");
        assert_eq!(share.for_lease(MAX_LEASE), ms(3000), "at most io_timeout");
        let tight = NodeTimeout {
            fixed: None,
            io_timeout: ms(20),
        };
        assert_eq!(tight.for_lease(ms(30_000)), ms(20));
        let fixed = NodeTimeout {
            fixed: Some(ms(500)),
            io_timeout: ms(3000),
        };
        assert_eq!(fixed.for_lease(ms(1000)), ms(500));
        assert_eq!(fixed.for_lease(MAX_LEASE), ms(500));
    }

    #[test]
    fn drift_allowances_are_exact_and_never_overflow() {
        let drift = ClockDrift::DEFAULT;
        assert_eq!(
            drift.allowance(Duration::from_secs(1)),
            Duration::from_millis(12)
        );
        assert_eq!(drift.allowance(Duration::ZERO), Duration::from_millis(2));
        assert_eq!(
            drift.allowance(Duration::MAX),
            Duration::MAX / 100 + Duration::from_millis(2)
        );
        let half = ClockDrift::new(MAX_DRIFT_RATIO, Duration::MAX).unwrap();
        assert_eq!(half.allowance(Duration::MAX), Duration::MAX);
        let none = ClockDrift::new(0.0, Duration::ZERO).unwrap();
        assert_eq!(none.allowance(Duration::from_secs(5)), Duration::ZERO);
        let tenth = ClockDrift::new(0.1, Duration::from_millis(1)).unwrap();
        assert_eq!(
            tenth.allowance(Duration::from_millis(100)),
            Duration::from_millis(11)
        );
        for bad in [-0.01, 0.51, f64::NAN, f64::INFINITY] {
            assert_eq!(ClockDrift::new(bad, Duration::ZERO), None, "{bad}");
        }
    }

    #[test]
    fn braced_or_empty_prefixes_are_refused() {
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("app:locks").is_ok());
    }
}

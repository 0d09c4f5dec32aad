//! The oldest server redbaton works with, checked on the first command
//! connection of each server a client uses, so that an old server is refused with a
//! clear error at the start rather than failing mid-run.

use redis::{ErrorKind, RedisResult};

/// Redis 6.2: `ZADD ... GT` (the semaphore's, read-write lock's and fair
/// lock's leases). Fractional `BLPOP` timeouts (every park) came in 6.0,
/// `CLIENT UNBLOCK` and script effect replication in 5.0. Valkey reports
/// the Redis version it matches (7.2.4 for every Valkey 7.2 and 8).
pub(crate) const MINIMUM: (u32, u32) = (6, 2);

/// The version the server on `conn` reports when it is older than
/// [`MINIMUM`]. A server that does not say (`INFO` refused by an ACL, a
/// proxy that hides it) passes: the check is a courtesy, not a gate.
/// Transport failures are returned, for the pool to close the connection.
pub(crate) fn too_old(conn: &mut redis::Connection) -> RedisResult<Option<String>> {
    let info: String = match redis::cmd("INFO").arg("server").query(conn) {
        Ok(info) => info,
        Err(err) if matches!(err.kind(), ErrorKind::Server(_)) => {
            log::debug!("redbaton: cannot read the server's version ({err}); not checked");
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    let Some(version) = redis_version(&info) else {
        return Ok(None);
    };
    Ok(is_too_old(version).then(|| version.to_owned()))
}

/// Whether `version` (as `INFO` reports it) is older than [`MINIMUM`];
/// one that cannot be read is not.
fn is_too_old(version: &str) -> bool {
    parse(version).is_some_and(|found| found < MINIMUM)
}

/// The `redis_version` field of an `INFO server` reply.
fn redis_version(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(str::trim)
}

/// `major.minor` of a version such as `7.0.15`.
fn parse(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_below_6_2_are_too_old() {
        let info = "# Server\r\nredis_version:6.0.16\r\nredis_mode:standalone\r\n";
        assert_eq!(redis_version(info), Some("6.0.16"));
        assert!(is_too_old("6.0.16"));
        assert!(is_too_old("5.0.7"));
        assert!(is_too_old("6.1.9"));
        assert!(!is_too_old("6.2.0"));
        // Valkey 8 reports the Redis version it matches.
        assert!(!is_too_old("7.2.4"));
        assert!(!is_too_old("10.0.1"));
        assert!(!is_too_old("garbage"));
        assert_eq!(parse("7.0.15"), Some((7, 0)));
    }
}

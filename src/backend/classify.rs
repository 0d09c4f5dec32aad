//! Turning redis-rs errors into [`Error`]s: which ones break a connection,
//! which ones say "not now", and a password-free description of each.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::Error;

/// Names the command a script's error points at (Redis does not, for a
/// command refused inside a script); supplied by the script layer, which
/// knows the sources. `None` when the message is not about one of ours.
pub(crate) type ScriptTracer = fn(&str) -> Option<String>;

/// Classifies a Redis error met while working on the object `name` (a lock
/// or limiter name; empty for client-wide keys) at `addr`.
pub(crate) fn from_redis(err: RedisError, name: &str, addr: &str, trace: ScriptTracer) -> Error {
    if err.code() == Some("WRONGTYPE") {
        return Error::WrongType {
            name: name.to_owned(),
            detail: err.detail().unwrap_or("WRONGTYPE").to_owned(),
        };
    }
    let detail = err.detail().unwrap_or_default();
    if err.code() == Some("NOPERM")
        || detail.contains("can't run this command")
        || detail.contains("can't access")
    {
        // Inside a script Redis names neither the command nor the key;
        // our script's source line does.
        let detail = match trace(detail) {
            Some(command) => format!("{command}: {detail}"),
            None => detail.to_owned(),
        };
        return Error::PermissionDenied { detail };
    }
    if is_auth_failure(&err) {
        return Error::AuthenticationFailed {
            addr: addr.to_owned(),
            detail: describe_io(&err),
            source: Some(err),
        };
    }
    // Reaches here only from a flavor that does not follow redirections.
    if matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) {
        return Error::WrongTopology {
            addr: addr.to_owned(),
            detail: "is a Redis Cluster node (it redirected a command to another node): build \
                     the client with Topology::cluster (the `cluster` feature)"
                .to_owned(),
        };
    }
    // A replica, or a master demoted by a failover: not now, here.
    if err.code() == Some("READONLY") {
        return Error::Unavailable {
            addr: addr.to_owned(),
            detail: format!("READONLY {detail}"),
        };
    }
    if is_transient_reply(err.code()) {
        return Error::Unavailable {
            addr: addr.to_owned(),
            detail: format!("{} {detail}", err.code().unwrap_or_default()),
        };
    }
    // A reply of an unexpected shape is our bug or a damaged key, not a
    // transport failure (the connection is closed all the same).
    if breaks_connection(&err) && err.kind() != ErrorKind::Parse {
        return Error::Unreachable {
            addr: addr.to_owned(),
            detail: describe_io(&err),
            timed_out: err.is_timeout(),
            source: Some(err),
        };
    }
    Error::Redis { source: err }
}

/// Whether an error leaves the connection in an unknown state: a reply may
/// still be on its way, so the connection must be closed, not reused.
/// Error replies from the server leave the connection in step.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    !matches!(
        err.kind(),
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
    )
}

/// Whether an error reply with this code says "not now" rather than "no":
/// the server is busy with a script, loading, or between masters.
pub(crate) fn is_transient_reply(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
    )
}

/// Whether Redis refused the credentials.
pub(crate) fn is_auth_failure(err: &RedisError) -> bool {
    err.kind() == ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// A short, password-free description of a transport failure.
pub(crate) fn describe_io(err: &RedisError) -> String {
    if err.is_timeout() {
        "timed out waiting for a reply".to_owned()
    } else if err.is_connection_refusal() {
        "connection refused".to_owned()
    } else if err.is_connection_dropped() {
        "connection dropped".to_owned()
    } else {
        err.to_string()
    }
}

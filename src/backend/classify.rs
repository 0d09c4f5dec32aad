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
    if is_permission_failure(err.code(), detail) {
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

/// Whether an error reply says the user's ACL forbids a command or a key.
/// Servers word it differently, and inside a script some give no `NOPERM`
/// code at all: Redis 7.0 answers "... can't run this command ..." or
/// "... can't access ..."; Redis 7.2 and later and Valkey answer "ERR ACL
/// failure in script: User u has no permissions to run the 'hset'
/// command" (or "to access the 'k' key"), and `NOPERM User u has no
/// permissions ...` outside scripts.
pub(crate) fn is_permission_failure(code: Option<&str>, detail: &str) -> bool {
    code == Some("NOPERM")
        || detail.contains("can't run this command")
        || detail.contains("can't access")
        || detail.starts_with("ACL failure in script")
        || detail.contains("has no permissions to")
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
        let text = err.to_string();
        match tls_hint(&text) {
            Some(hint) => format!("{text}: {hint}"),
            None => text,
        }
    }
}

/// What to do about a TLS handshake the server ended with an alert about
/// the client's certificate.
fn tls_hint(message: &str) -> Option<&'static str> {
    if message.contains("CertificateRequired") {
        Some("the server wants a client certificate (ClientBuilder::tls_client_certificate)")
    } else if [
        "UnknownCA",
        "BadCertificate",
        "CertificateUnknown",
        "AccessDenied",
    ]
    .iter()
    .any(|alert| message.contains(alert))
    {
        Some("the server refused this client certificate (signed by a CA it does not trust, or expired)")
    } else {
        None
    }
}

/// A cluster's `MOVED` or `ASK`: the command did not run here.
pub(super) fn is_redirection(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permission_failure_is_recognised_in_every_server_s_wording() {
        // Redis 7.0, inside a script (the code is ERR or NOPERM by version).
        let redis_7_0 = "The user executing the script can't run this command or subcommand \
                         script: 4a63, on @user_script:106.";
        // Redis 7.2+ and Valkey 8, inside a script: no NOPERM code.
        let valkey_command = "ACL failure in script: User no-hset has no permissions to run \
                              the 'hset' command script: 4a63, on @user_script:106.";
        let valkey_key = "ACL failure in script: User u has no permissions to access the \
                          'redbaton:{a}:lock' key script: 4a63, on @user_script:12.";
        for detail in [redis_7_0, valkey_command, valkey_key] {
            assert!(is_permission_failure(Some("ERR"), detail), "{detail}");
        }
        assert!(is_permission_failure(Some("NOPERM"), "anything"));
        assert!(!is_permission_failure(
            Some("ERR"),
            "Error running script (call to f_4a63): @user_script:3: user_script:3: \
             attempt to compare nil with number"
        ));
        assert!(!is_permission_failure(
            Some("WRONGTYPE"),
            "Operation against a key"
        ));
    }
}

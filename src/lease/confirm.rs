//! `replica_acks` for releases: a release that only the master has is
//! lost when a replica is promoted, and the promoted replica then keeps
//! an ownership nobody holds for its whole lease. So under `replica_acks`
//! a last release is confirmed like an acquisition (`WAIT` on the
//! connection that wrote it), and one the replicas did not confirm is
//! sent again by the watchdog ([`Cleanup`](super::Cleanup)) to whichever
//! master is current, until it is confirmed there or the lease is over.

use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, ServerErrorKind};

use crate::backend::{Backend, Failed, Sent};
use crate::config::ReplicaAcks;
use crate::error::Error;
use crate::scripts::millis;

/// `WAIT replicas timeout` on `c`: how many replicas have every write this
/// connection made, once that many do or the timeout passes. A connection
/// that wrote nothing counts the replicas in sync with the master.
///
/// A master demoted while this `WAIT` blocked ends it with `UNBLOCKED`,
/// and one demoted before refuses it with a plain error: both are told
/// as `READONLY`, as a write there would have been, so that a Sentinel
/// client looks the master up again and sends the exchange to the new one.
pub(crate) fn wait(c: &mut dyn ConnectionLike, acks: ReplicaAcks) -> RedisResult<u32> {
    redis::cmd("WAIT")
        .arg(acks.replicas)
        .arg(millis(acks.timeout))
        .query(c)
        .map_err(|err| {
            let demoted = err.code() == Some("UNBLOCKED")
                || err.to_string().contains("WAIT cannot be used with replica");
            if demoted {
                let kind = ErrorKind::Server(ServerErrorKind::ReadOnly);
                RedisError::from((
                    kind,
                    "WAIT refused: the server is a replica",
                    err.to_string(),
                ))
            } else {
                err
            }
        })
}

/// The error for a write that `acknowledged` replicas of `backend`'s
/// master confirmed, fewer than `acks` asks for.
pub(crate) fn not_replicated(backend: &Backend, acks: ReplicaAcks, acknowledged: u32) -> Error {
    Error::NotReplicated {
        addr: backend.addr().to_owned(),
        wanted: acks.replicas,
        acknowledged,
        timeout: acks.timeout,
    }
}

/// Runs `exchange` on the server of `key` (for object `name`); then, when
/// `acks` is set and `confirm` says the reply needs it, `WAIT`s on the
/// same connection. Too few confirmations are [`Error::NotReplicated`]
/// with the outcome unknown: the master has the write, its replicas may
/// not, and the caller sends it again later (every release is safe to
/// send twice).
pub(crate) fn exchange_confirmed<T>(
    backend: &Backend,
    key: &str,
    name: &str,
    acks: Option<ReplicaAcks>,
    confirm: impl Fn(&T) -> bool,
    exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
) -> Result<Sent<T>, Failed> {
    match acks {
        None => backend.exchange(key, name, exchange),
        Some(acks) => exchange_then_wait(backend, key, name, acks, confirm, exchange),
    }
}

/// [`exchange_confirmed`] with `acks` set. A function of its own, so that
/// the exchanges without `replica_acks` do not carry its frame (waiting
/// threads may have small stacks).
fn exchange_then_wait<T>(
    backend: &Backend,
    key: &str,
    name: &str,
    acks: ReplicaAcks,
    confirm: impl Fn(&T) -> bool,
    mut exchange: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
) -> Result<Sent<T>, Failed> {
    let sent = backend.exchange(key, name, |c| {
        let reply = exchange(c)?;
        if !confirm(&reply) {
            return Ok((reply, None));
        }
        let acknowledged = wait(c, acks)?;
        Ok((reply, Some(acknowledged).filter(|&n| n < acks.replicas)))
    })?;
    match sent.value {
        (value, None) => Ok(Sent {
            value,
            resent: sent.resent,
        }),
        (_, Some(acknowledged)) => Err(Failed {
            error: not_replicated(backend, acks, acknowledged),
            outcome_unknown: true,
        }),
    }
}

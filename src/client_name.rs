//! The client's name as an operator sees it: every connection carries it
//! (`CLIENT SETNAME`, in the backend's pools), and one key per client
//! instance maps the instance id that starts every owner identity to it,
//! so that [`Holder::client_name`](crate::Holder::client_name) can say
//! which host and process holds a lock. The key is written once per client
//! and kept alive by the client's lock calls and its watchdog, not by
//! each acquisition, so the uncontended cycle does not grow.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::Error;
use crate::keys;

/// How long a client's name record lives without a refresh: long enough
/// that the client's watchdog rounds (a third of a lease apart) and its
/// lock calls keep it, short enough that a dead client's record goes.
fn record_ttl(config: &Config) -> Duration {
    (config.default_lease * 3).max(Duration::from_secs(600))
}

/// The key that names client instance `instance` (the part of an owner
/// identity before its last `:`). Tagged with the identity counter's name,
/// so that on a Cluster it lives on the node the client's first `INCR`
/// went to: a client's lock calls reach no node beyond those of its locks
/// and that counter.
fn record_key(prefix: &str, instance: &str) -> String {
    format!(
        "{prefix}:{{{}}}:client:{instance}",
        keys::identity_counter(prefix)
    )
}

/// One client's name record, and when it was last written.
#[derive(Debug)]
pub(crate) struct NameRecord {
    backend: Arc<Backend>,
    key: String,
    name: Arc<str>,
    ttl: Duration,
    /// `None`: never written, or the last write failed.
    written: Mutex<Option<Instant>>,
}

impl NameRecord {
    /// The record of the client `instance` of `backend`; `None` on a
    /// Redlock quorum, whose masters share nothing (its holders show no
    /// name).
    pub(crate) fn new(backend: &Arc<Backend>, config: &Config, instance: &str) -> Option<Self> {
        if backend.masters().is_some() {
            return None;
        }
        Some(NameRecord {
            backend: Arc::clone(backend),
            key: record_key(&config.prefix, instance),
            name: Arc::clone(&config.client_name),
            ttl: record_ttl(config),
            written: Mutex::new(None),
        })
    }

    /// Writes the record when it was never written or a third of its TTL
    /// has passed. Never fails the caller: the name only informs, so a
    /// failure is logged and the next call tries again. One thread writes
    /// at a time; the others go on.
    pub(crate) fn refresh_if_due(&self) {
        let Some(mut written) = self.written.try_lock() else {
            return;
        };
        if written.is_some_and(|at| at.elapsed() < self.ttl / 3) {
            return;
        }
        let set: Result<(), Error> = self.backend.run(&self.key, "", |c| {
            redis::cmd("SET")
                .arg(&self.key)
                .arg(&*self.name)
                .arg("PX")
                .arg(crate::scripts::millis(self.ttl))
                .query(c)
        });
        *written = match set {
            Ok(()) => Some(Instant::now()),
            Err(err) => {
                log::debug!("redbaton: writing the client name record failed: {err}");
                None
            }
        };
    }
}

/// The name of the client whose thread identity is `owner`, if its record
/// is there (a client of an older version, or one gone for longer than its
/// record's TTL, has none).
pub(crate) fn name_of(
    backend: &Backend,
    prefix: &str,
    owner: &str,
) -> Result<Option<String>, Error> {
    let Some((instance, _thread)) = owner.rsplit_once(':') else {
        return Ok(None);
    };
    let key = record_key(prefix, instance);
    backend.run(&key, "", |c| redis::cmd("GET").arg(&key).query(c))
}

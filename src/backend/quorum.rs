//! Several independent masters for a Redlock quorum: a [`Backend`] per
//! master (each a `single`), for the quorum lock to fan its exchanges out
//! to. Here only what is not per master: parking, on one reachable master
//! at a time (the releaser pushes a baton on every master where it held the
//! lock), moving on to the next when that one fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Backend, Parked};
use crate::error::Error;

pub(super) struct Quorum {
    masters: Vec<Arc<Backend>>,
    /// The master waiters park on.
    parking: AtomicUsize,
    /// For messages: every master's address.
    addrs: String,
}

impl Quorum {
    pub(super) fn new(masters: Vec<Arc<Backend>>) -> Self {
        let addrs = masters
            .iter()
            .map(|m| m.addr().to_owned())
            .collect::<Vec<_>>()
            .join(", ");
        Quorum {
            masters,
            parking: AtomicUsize::new(0),
            addrs,
        }
    }

    pub(super) fn addr(&self) -> &str {
        &self.addrs
    }

    pub(super) fn masters(&self) -> &[Arc<Backend>] {
        &self.masters
    }

    /// Parks on the current parking master; a failure there moves waiters
    /// to the next one and counts as a wake-up.
    pub(super) fn park(
        &self,
        name: &str,
        list: &str,
        park: Duration,
        precise: bool,
    ) -> Result<Parked, Error> {
        let index = self.parking.load(Ordering::Relaxed) % self.masters.len();
        let moved_on = |err: Error| {
            let _ = self.parking.compare_exchange(
                index,
                (index + 1) % self.masters.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            Ok(Parked::ConnectionFailed(err))
        };
        match self.masters[index].park(name, list, park, precise) {
            Ok(Parked::ConnectionFailed(err)) => moved_on(err),
            Err(err) if err.is_transient() || err.is_timeout() => moved_on(err),
            other => other,
        }
    }
}

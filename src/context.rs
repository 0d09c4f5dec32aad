//! The runtime one client's handles share: its settings, backend, thread
//! identities, waiting room and lease machinery. Below the facade (the
//! `client` module makes it, the synchronizers use it), and above the
//! machinery it assembles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use crate::backend::Backend;
use crate::client_name::NameRecord;
use crate::config::Config;
use crate::error::Error;
use crate::identity::Identities;
use crate::keys;
use crate::lease::{
    Claim, Cleanup, Entered, Grant, LeaseMode, LeaseRuntime, LeaseStatus, Leased, Watchdog,
};
use crate::observe::{HoldKind, LostReason, Observer};
use crate::parking::WaitingRoom;

/// What every handle of one client shares.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) config: Config,
    pub(crate) backend: Arc<Backend>,
    pub(crate) identities: Identities,
    /// Where threads wait for locks.
    pub(crate) lock_room: WaitingRoom<Claim, Grant>,
    /// Where threads wait for what is never handed over locally (read
    /// holds, permits, a latch): a process still parks once per baton key,
    /// however many of its threads wait.
    pub(crate) room: WaitingRoom<(), ()>,
    /// The ownership table and the watchdog; the watchdog thread holds a
    /// `Weak` to this alone.
    pub(crate) leases: Arc<LeaseRuntime>,
    /// Numbers requests that may create an ownership.
    requests: AtomicU64,
}

impl Context {
    /// Assembles a client's runtime; `instance`: the client's random id.
    pub(crate) fn new(config: Config, backend: Arc<Backend>, instance: uuid::Uuid) -> Self {
        let identities = Identities::new(keys::identity_counter(&config.prefix), instance);
        let name = NameRecord::new(&backend, &config, &identities.instance().to_string());
        Context {
            identities,
            lock_room: WaitingRoom::new(Arc::clone(&backend), &config),
            room: WaitingRoom::without_hand_offs(Arc::clone(&backend), &config),
            leases: Arc::new(LeaseRuntime::new(
                name,
                config.observer.clone(),
                config.replica_acks.map(|acks| acks.timeout),
            )),
            backend,
            config,
            requests: AtomicU64::new(0),
        }
    }

    /// The calling thread's identity under this client.
    pub(crate) fn identity(&self) -> Result<Arc<str>, Error> {
        // Before the thread-local cache: a forked child inherits the
        // calling thread's identity and must not use it.
        self.backend.check_process()?;
        if let Some(name) = &self.leases.name {
            name.refresh_if_due();
        }
        self.identities.current(|counter| {
            // Independent masters share no counter: the instance's own
            // count, after its random id, is unique without one.
            if self.backend.masters().is_some() {
                return Ok(0);
            }
            self.backend
                .run(counter, "", |c| redis::cmd("INCR").arg(counter).query(c))
                .map_err(|err| damaged_counter(err, counter))
        })
    }

    /// A number for one request that may create an ownership, unique within
    /// this client: it lets an ownership whose reply was lost be found and
    /// undone.
    pub(crate) fn next_request(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Records a guard of the ownership `fence` of `identity` on `leased`,
    /// whose request was sent at `sent` asking for `mode`, and has the
    /// watchdog renew it when it is renewed. Returns the ownership's status
    /// (shared by its guards) and its lease mode (that of its first
    /// acquisition).
    pub(crate) fn enter(
        &self,
        leased: &Leased,
        identity: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> (Arc<LeaseStatus>, LeaseMode) {
        let entered = self.enter_as(leased, identity, identity, fence, mode, sent);
        (entered.status, entered.mode)
    }

    /// [`enter`](Context::enter) for a lock `thread` holds as `identity` in
    /// Redis (that of the thread of this client that took it there, which
    /// may have passed it on in memory since); also returns the thread's
    /// token.
    pub(crate) fn enter_as(
        &self,
        leased: &Leased,
        thread: &Arc<str>,
        identity: &Arc<str>,
        fence: u64,
        mode: LeaseMode,
        sent: Instant,
    ) -> Entered {
        let entered = self
            .leases
            .registry
            .enter(leased, thread, identity, fence, mode, sent);
        if let Some(due) = entered.new_renewal {
            Watchdog::wake(&self.leases, Some(due));
        }
        entered
    }

    /// The event hook (unset: no event is made).
    pub(crate) fn observer(&self) -> &Observer {
        &self.config.observer
    }

    /// A receiver of the loss signal of the ownership `status` of `name`,
    /// held in lease `mode`: the watchdog tells it when it finds a renewed
    /// lease lost, and a fixed lease's end is watched from now on.
    pub(crate) fn lost_signal(
        &self,
        status: &Arc<LeaseStatus>,
        mode: LeaseMode,
        name: &str,
        kind: HoldKind,
    ) -> Receiver<LostReason> {
        let receiver = status.subscribe();
        if let LeaseMode::Fixed(_) = mode {
            if status.is_watched() {
                Watchdog::watch_expiry(&self.leases, status, name.into(), kind);
            }
        }
        receiver
    }

    /// Hands a release that could not be confirmed to the watchdog thread.
    pub(crate) fn finish_later(&self, cleanup: Cleanup) {
        Watchdog::clean_up(&self.leases, cleanup);
    }
}

/// Names the identity counter when it is what went wrong: something else
/// was written under it (a hash: WRONGTYPE; a string that is no integer).
fn damaged_counter(err: Error, counter: &str) -> Error {
    let detail = match &err {
        Error::WrongType { detail, .. } => detail.clone(),
        Error::Redis { source }
            if source
                .detail()
                .is_some_and(|d| d.contains("not an integer")) =>
        {
            source.detail().unwrap_or_default().to_owned()
        }
        _ => return err,
    };
    Error::DamagedKey {
        key: counter.to_owned(),
        detail,
    }
}

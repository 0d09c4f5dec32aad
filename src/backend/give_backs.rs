//! Grants that found no parked waiter, given back on a thread of their
//! own (see `grants`): a give-back is a round trip, which a slow or
//! unanswering server stretches to the I/O timeout, and the hub's
//! listener that heard the grant must go on reading meanwhile. Were it to
//! give back itself, every other grant to the client's waiters would wait
//! behind that round trip, and a grant unheard for its lease is a lock
//! held by nobody for that long.
//!
//! The thread starts with the first give-back and ends when the hub is
//! gone and every grant queued before was given back.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use super::classify::{self, ScriptTracer};
use super::grants::{Granted, Grants};
use super::pool::Pool;

/// The name of the thread, as seen in debuggers and `/proc`.
const THREAD_NAME: &str = "redbaton-give-back";

/// One hub's give-backs.
pub(super) struct GiveBacks {
    /// Where grants go to be given back, once the thread runs.
    queue: Mutex<Option<Sender<Granted>>>,
    giver: Giver,
}

/// What gives a grant back: the hub's command connections and the
/// client's grants.
#[derive(Clone)]
struct Giver {
    commands: Pool,
    grants: Arc<Grants>,
    io_timeout: Duration,
    trace: ScriptTracer,
}

impl GiveBacks {
    /// Give-backs on connections of `commands`, through what the client's
    /// synchronizer installed in `grants`.
    pub(super) fn new(
        commands: Pool,
        grants: Arc<Grants>,
        io_timeout: Duration,
        trace: ScriptTracer,
    ) -> GiveBacks {
        GiveBacks {
            queue: Mutex::new(None),
            giver: Giver {
                commands,
                grants,
                io_timeout,
                trace,
            },
        }
    }

    /// Has `granted` given back on the thread, started now if it does not
    /// run yet; on the caller's thread where no thread can be started.
    pub(super) fn give_back(&self, granted: Granted) {
        let mut queue = self.queue.lock();
        let sender = match &mut *queue {
            Some(sender) => sender,
            None => match self.start() {
                Ok(sender) => queue.insert(sender),
                Err(err) => {
                    drop(queue);
                    log::debug!(
                        "redbaton: no thread to give grants back on ({err}); giving one back here"
                    );
                    self.giver.give_back(&granted);
                    return;
                }
            },
        };
        // The thread ends only once every sender is gone: it reads.
        if let Err(unsent) = sender.send(granted) {
            drop(queue);
            self.giver.give_back(&unsent.into_inner());
        }
    }

    /// Starts the thread; the sender of its queue.
    fn start(&self) -> std::io::Result<Sender<Granted>> {
        let (sender, receiver) = crossbeam_channel::unbounded::<Granted>();
        let giver = self.giver.clone();
        thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || {
                receiver
                    .iter()
                    .for_each(|granted| giver.give_back(&granted))
            })?;
        Ok(sender)
    }
}

impl Giver {
    /// Gives `granted` back, and tells the log how that went: a give-back
    /// that fails leaves what was granted held until the grant's lease
    /// ends, which nobody waits for.
    fn give_back(&self, granted: &Granted) {
        let given = self.commands.get(self.io_timeout).and_then(|mut conn| {
            conn.run(|c| self.grants.give_back(c, granted))
                .map_err(|err| {
                    classify::from_redis(
                        err,
                        "(a grant given back)",
                        self.commands.addr(),
                        self.trace,
                    )
                })
        });
        match given {
            Ok(()) => log::debug!(
                "redbaton: gave back a grant of {:?} that no parked waiter took",
                granted.key
            ),
            Err(err) => log::warn!(
                "redbaton: giving back a grant of {:?} that no parked waiter took failed \
                 ({err}); it is free at the end of the grant's lease",
                granted.key
            ),
        }
    }
}

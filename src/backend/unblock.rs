//! Precise ends of parks: Redis fires a `BLPOP`'s timeout from its timer
//! (`hz`, 10 by default), so a parked client is released up to ~100 ms
//! after its timeout. This timer, one thread per client, sends
//! `CLIENT UNBLOCK <id> TIMEOUT` on a command connection when a park is
//! due: the server then answers the `BLPOP` with nil, as for its own
//! timeout, so no token is swallowed and the connection stays usable. The
//! `BLPOP` keeps its own timeout as a backstop.
//!
//! An unblock that arrives after its park ended by itself (a token came
//! just before) may meet the next park on the same connection and end it
//! early: a spurious wake-up, which costs that waiter one attempt, never a
//! token. If the server refuses `CLIENT UNBLOCK` (an ACL without it), the
//! client warns once and parks end on the server's timer, as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use super::classify::{breaks_connection, describe_io};
use super::pool::Pool;

/// Name of the timer thread, as seen in debuggers and `/proc`.
const THREAD_NAME: &str = "redbaton-unblock";

/// One park to end at `at`, while `active`.
struct Due {
    at: Instant,
    client_id: i64,
    active: Arc<AtomicBool>,
}

/// A scheduled unblock; dropping it (when the park ends) cancels it.
#[derive(Debug)]
pub(super) struct Scheduled(Arc<AtomicBool>);

impl Drop for Scheduled {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The client's side of the timer.
pub(super) struct Unblocker {
    schedule: Sender<Due>,
    /// Taken by the thread when it starts (lazily, with the first park).
    start: Mutex<Option<(Receiver<Due>, Pool)>>,
    /// Set when the server refused `CLIENT UNBLOCK`.
    refused: Arc<AtomicBool>,
    io_timeout: Duration,
}

impl Unblocker {
    /// A timer that unblocks through connections of `commands`.
    pub(super) fn new(commands: Pool, io_timeout: Duration) -> Self {
        let (schedule, receiver) = crossbeam_channel::unbounded();
        Unblocker {
            schedule,
            start: Mutex::new(Some((receiver, commands))),
            refused: Arc::new(AtomicBool::new(false)),
            io_timeout,
        }
    }

    /// Ends the park of the connection `client_id` at `at`, unless the
    /// returned value is dropped first. `None` when unblocking is off.
    pub(super) fn schedule(&self, client_id: i64, at: Instant) -> Option<Scheduled> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        if let Some((receiver, commands)) = self.start.lock().take() {
            let refused = Arc::clone(&self.refused);
            let io_timeout = self.io_timeout;
            let spawned = thread::Builder::new()
                .name(THREAD_NAME.to_owned())
                .spawn(move || run(&receiver, &commands, &refused, io_timeout));
            if let Err(err) = spawned {
                log::warn!("redbaton: cannot start the unblock timer ({err}); parks end on the server's timer");
                self.refused.store(true, Ordering::Relaxed);
                return None;
            }
        }
        let active = Arc::new(AtomicBool::new(true));
        let due = Due {
            at,
            client_id,
            active: Arc::clone(&active),
        };
        self.schedule.send(due).ok()?;
        Some(Scheduled(active))
    }
}

/// The thread's body: ends when the client (the sender) is gone.
fn run(schedule: &Receiver<Due>, commands: &Pool, refused: &AtomicBool, io_timeout: Duration) {
    let mut dues: Vec<Due> = Vec::new();
    loop {
        dues.retain(|due| due.active.load(Ordering::Acquire));
        let next = dues.iter().map(|due| due.at).min();
        let message = match next {
            Some(at) => schedule.recv_deadline(at),
            None => schedule.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match message {
            Ok(due) => dues.push(due),
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        for due in dues.iter().filter(|due| due.at <= now) {
            if due.active.swap(false, Ordering::AcqRel) {
                unblock(commands, due.client_id, refused, io_timeout);
            }
        }
    }
}

/// Sends one `CLIENT UNBLOCK <id> TIMEOUT`; a refusal turns the timer off.
fn unblock(commands: &Pool, client_id: i64, refused: &AtomicBool, io_timeout: Duration) {
    let mut conn = match commands.get(io_timeout) {
        Ok(conn) => conn,
        Err(err) => {
            // The park ends on the server's timer instead.
            log::debug!("redbaton: no connection to end a park: {err}");
            return;
        }
    };
    let sent: redis::RedisResult<i64> = conn.run(|c| {
        redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(client_id)
            .arg("TIMEOUT")
            .query(c)
    });
    match sent {
        Ok(_) => {}
        // An error reply (NOPERM, an unknown subcommand): not allowed here.
        Err(err) if !breaks_connection(&err) => {
            if !refused.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "redbaton: Redis refused CLIENT UNBLOCK ({err}); waiters now wake on the server's \
                     timer, up to 100 ms late (hz 10). Grant +client|id +client|unblock (see the ACL line in redbaton's docs/security.md)"
                );
            }
        }
        Err(err) => log::debug!("redbaton: ending a park failed: {}", describe_io(&err)),
    }
}

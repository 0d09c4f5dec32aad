//! Low-level process helpers shared by [`crate::RedisServer`] and
//! [`crate::ChildProcess`]: signals, bounded reaping and run-state polling.
//!
//! The one rule every caller relies on: a pid is only signalled while its
//! `Child` has not been reaped. An exited but unreaped child is a zombie that
//! still owns its pid, so it can never be recycled under us; once `try_wait`
//! reports an exit we stop signalling, because from then on the kernel may
//! hand that pid to an unrelated process.

use std::io;
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// Upper bound on a single sleep while polling, so deadlines are honoured
/// closely without burning a core.
const MAX_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Sends `signal` to `pid` with kill(2).
fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    // pid 0 and negative pids address whole process groups; refuse them so a
    // bogus value can never signal the test runner itself.
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|pid| *pid > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) only takes two integers and does not access memory owned
    // by this process; a failure is reported through the return value/errno,
    // which is read immediately below.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Returns whether the kernel still knows a process with this pid (this
/// includes zombies that have exited but were not reaped yet).
///
/// Useful in tests to check that a process really went away after
/// [`crate::RedisServer`] or [`crate::ChildProcess`] was dropped. Only a
/// "no such process" answer counts as absent: a permission error means the
/// process exists but belongs to someone else. Pid 0 and pids beyond the
/// platform range never name a single process, so they report `false`.
pub fn pid_exists(pid: u32) -> bool {
    match send_signal(pid, 0) {
        Ok(()) => true,
        Err(err) if err.kind() == io::ErrorKind::InvalidInput => false,
        Err(err) => err.raw_os_error() != Some(libc::ESRCH),
    }
}

/// Sends `signal` to `child` unless it has already been reaped.
///
/// Returns `Ok(false)` when the child had already exited, in which case
/// nothing was sent (see the module docs for why).
pub(crate) fn signal_child(child: &mut Child, signal: libc::c_int) -> io::Result<bool> {
    if child.try_wait()?.is_some() {
        return Ok(false);
    }
    send_signal(child.id(), signal)?;
    Ok(true)
}

/// Polls `child` until it exits or `timeout` elapses; `Ok(None)` on timeout.
pub(crate) fn reap(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut interval = Duration::from_micros(200);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(interval.min(deadline - now));
        interval = (interval * 2).min(MAX_POLL_INTERVAL);
    }
}

/// SIGKILLs `child` (if still unreaped) and reaps it within `timeout`.
///
/// Idempotent: a child that was already reaped just returns its status.
pub(crate) fn kill_and_reap(child: &mut Child, timeout: Duration) -> io::Result<ExitStatus> {
    signal_child(child, libc::SIGKILL)?;
    reap(child, timeout)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "pid {} did not exit within {timeout:?} of SIGKILL",
                child.id()
            ),
        )
    })
}

/// Waits until `pid` is (or is no longer) in the stopped state.
///
/// kill(2) only queues SIGSTOP/SIGCONT; on a busy machine the target may keep
/// running for a moment. Tests that pause a process and immediately expect
/// it to be unresponsive need the state change to be observable first, so
/// on Linux this polls `/proc/<pid>/stat`. Elsewhere there is no portable
/// way to observe the state, and the signal is assumed to have landed.
pub(crate) fn wait_for_stop_state(pid: u32, stopped: bool, timeout: Duration) -> io::Result<()> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let path = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + timeout;
    loop {
        let stat = std::fs::read_to_string(&path)?;
        if is_stopped_state(&stat)? == stopped {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            let wanted = if stopped { "stopped" } else { "running" };
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("pid {pid} was not {wanted} within {timeout:?}"),
            ));
        }
        thread::sleep(Duration::from_millis(1).min(deadline - now));
    }
}

/// Parses the state letter out of a `/proc/<pid>/stat` line.
fn is_stopped_state(stat: &str) -> io::Result<bool> {
    // The command name in parentheses may itself contain spaces and ')', so
    // the state is the first field after the *last* closing parenthesis.
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat"))?;
    Ok(state == "T")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_state_is_read_after_the_last_parenthesis() {
        assert!(is_stopped_state("42 (a (weird) name) T 1 2 3").unwrap());
        assert!(!is_stopped_state("42 (redis-server *:1) S 1 2 3").unwrap());
        assert!(is_stopped_state("garbage").is_err());
    }

    #[test]
    fn pid_zero_and_out_of_range_pids_do_not_exist() {
        assert!(!pid_exists(0));
        assert!(!pid_exists(u32::MAX));
        assert!(pid_exists(std::process::id()));
    }
}

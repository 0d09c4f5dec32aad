//! A second real process whose stdout is read line by line.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use crate::process::{kill_and_reap, reap, signal_child, wait_for_stop_state};

/// Bound on reaping a SIGKILLed child.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on SIGSTOP/SIGCONT becoming visible in the process state.
const SIGNAL_STATE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a panic message waits for the exit status of a child whose
/// stdout just closed; only for diagnostics, so kept short.
const EXIT_STATUS_GRACE: Duration = Duration::from_secs(1);
/// Lines of recent output quoted in panic messages.
const HISTORY_LINES: usize = 40;

/// A child process with stdout piped and read line by line on a background
/// thread, so waits on its output can have deadlines.
///
/// Typical use re-executes the current test binary on one `#[ignore]`d test
/// (see [`ChildProcess::spawn_test`]) that reads its role from environment
/// variables and prints result lines with a known prefix. Dropping the value
/// SIGKILLs and reaps the child.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
    /// What this child is, for panic messages.
    description: String,
    lines: Receiver<String>,
    /// Lines received but not yet returned by a prefix search.
    pending: VecDeque<String>,
    /// The most recent lines received, for panic messages.
    history: VecDeque<String>,
    stdout_closed: bool,
}

/// Why waiting for the next line ended without one.
enum NoLine {
    TimedOut,
    Closed,
}

impl ChildProcess {
    /// Re-executes the current test binary to run exactly `test_name`
    /// (including `#[ignore]`d tests) with `envs` added to the environment.
    ///
    /// Arguments are `test_name --exact --include-ignored --nocapture
    /// --test-threads 1`; stdin is null, stderr is inherited so the child's
    /// panics show up in the parent's output.
    ///
    /// libtest prints `test NAME ... ` and the test's first output on the
    /// same line; that header is split off so the first `println!` of the
    /// child test is seen as a line of its own by the prefix matchers.
    ///
    /// # Panics
    ///
    /// Panics when the binary cannot be located or spawned.
    pub fn spawn_test(test_name: &str, envs: &[(&str, String)]) -> ChildProcess {
        let exe = std::env::current_exe()
            .unwrap_or_else(|err| panic!("cannot locate the current test binary: {err}"));
        let mut cmd = Command::new(exe);
        cmd.args([
            test_name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .envs(envs.iter().map(|(key, value)| (*key, value.as_str())))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
        // libtest prints "test NAME ... " without a newline before running
        // the test, so the child's first line would otherwise be glued to it
        // and missed by a prefix match.
        let libtest_header = format!("test {test_name} ... ");
        Self::spawn_described(
            cmd,
            format!("test child `{test_name}`"),
            Some(libtest_header),
        )
    }

    /// Spawns an arbitrary command with stdout piped and read like
    /// [`ChildProcess::spawn_test`] does. Stdin and stderr are left as
    /// configured on `cmd` (inherited by default).
    ///
    /// # Panics
    ///
    /// Panics when the command cannot be spawned.
    pub fn spawn_command(cmd: Command) -> ChildProcess {
        let description = format!("child `{}`", cmd.get_program().to_string_lossy());
        Self::spawn_described(cmd, description, None)
    }

    fn spawn_described(
        mut cmd: Command,
        description: String,
        libtest_header: Option<String>,
    ) -> ChildProcess {
        cmd.stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|err| panic!("cannot spawn {description}: {err}"));
        let description = format!("{description} (pid {})", child.id());
        let stdout = child.stdout.take().expect("stdout was configured as piped");
        let (tx, rx) = mpsc::channel();
        let reader = thread::Builder::new()
            .name(format!("testkit-stdout-{}", child.id()))
            .spawn(move || forward_lines(stdout, tx, libtest_header));
        if let Err(err) = reader {
            // Do not leave an unsupervised process behind.
            let _ = kill_and_reap(&mut child, REAP_TIMEOUT);
            panic!("cannot start the stdout reader for {description}: {err}");
        }
        // The reader thread is detached on purpose: it ends when the pipe
        // closes, and joining it could hang if a grandchild kept the pipe open.
        ChildProcess {
            child,
            description,
            lines: rx,
            pending: VecDeque::new(),
            history: VecDeque::new(),
            stdout_closed: false,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Returns the first not yet consumed stdout line starting with `prefix`,
    /// with the prefix stripped and the rest trimmed.
    ///
    /// Lines without the prefix (libtest noise, or results another call will
    /// ask for) are skipped but kept, so a later call can still find them.
    ///
    /// # Panics
    ///
    /// Panics, quoting the recent output, when no such line arrives within
    /// `timeout` or stdout closes first.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> String {
        if let Some(index) = self.pending.iter().position(|l| l.starts_with(prefix)) {
            let line = self.pending.remove(index).expect("index was just found");
            return strip(&line, prefix);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_line(deadline) {
                Ok(line) if line.starts_with(prefix) => return strip(&line, prefix),
                Ok(line) => self.pending.push_back(line),
                Err(NoLine::TimedOut) => panic!(
                    "{}: no line starting with {prefix:?} within {timeout:?}\n{}",
                    self.description,
                    self.recent_output()
                ),
                Err(NoLine::Closed) => {
                    let status = self.exit_status_hint();
                    panic!(
                        "{}: stdout closed ({status}) before a line starting with {prefix:?}\n{}",
                        self.description,
                        self.recent_output()
                    )
                }
            }
        }
    }

    /// Collects every remaining line starting with `prefix` (stripped and
    /// trimmed, in order) until stdout closes, then waits for the child to
    /// exit.
    ///
    /// # Panics
    ///
    /// Panics when stdout does not close or the child does not exit within
    /// `timeout`, or when the child exits unsuccessfully (the message
    /// includes the exit status and recent output).
    pub fn lines_with_prefix_until_exit(&mut self, prefix: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut found = Vec::new();
        let mut rest = VecDeque::new();
        for line in self.pending.drain(..) {
            if line.starts_with(prefix) {
                found.push(strip(&line, prefix));
            } else {
                rest.push_back(line);
            }
        }
        self.pending = rest;
        loop {
            match self.next_line(deadline) {
                Ok(line) if line.starts_with(prefix) => found.push(strip(&line, prefix)),
                Ok(line) => self.pending.push_back(line),
                Err(NoLine::Closed) => break,
                Err(NoLine::TimedOut) => panic!(
                    "{}: stdout still open after {timeout:?}\n{}",
                    self.description,
                    self.recent_output()
                ),
            }
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        let status = match reap(&mut self.child, remaining) {
            Ok(Some(status)) => status,
            Ok(None) => panic!(
                "{}: stdout closed but the process did not exit within {timeout:?}",
                self.description
            ),
            Err(err) => panic!("{}: cannot wait for exit: {err}", self.description),
        };
        if !status.success() {
            panic!(
                "{}: exited unsuccessfully ({status})\n{}",
                self.description,
                self.recent_output()
            );
        }
        found
    }

    /// SIGKILLs the child and reaps it. Calling it again is a no-op.
    ///
    /// # Panics
    ///
    /// Panics if the child cannot be reaped within 10 s.
    pub fn kill(&mut self) {
        if let Err(err) = kill_and_reap(&mut self.child, REAP_TIMEOUT) {
            panic!("{}: cannot kill: {err}", self.description);
        }
    }

    /// Freezes the child with SIGSTOP and waits until it is stopped.
    ///
    /// # Panics
    ///
    /// Panics when the child already exited.
    pub fn signal_stop(&mut self) {
        self.signal_and_wait(libc::SIGSTOP, true);
    }

    /// Lets a stopped child run again with SIGCONT.
    ///
    /// # Panics
    ///
    /// Panics when the child already exited.
    pub fn signal_continue(&mut self) {
        self.signal_and_wait(libc::SIGCONT, false);
    }

    fn signal_and_wait(&mut self, signal: libc::c_int, stopped: bool) {
        match signal_child(&mut self.child, signal) {
            Ok(true) => {}
            Ok(false) => panic!(
                "{}: cannot signal, it already exited\n{}",
                self.description,
                self.recent_output()
            ),
            Err(err) => panic!("{}: cannot signal: {err}", self.description),
        }
        if let Err(err) = wait_for_stop_state(self.child.id(), stopped, SIGNAL_STATE_TIMEOUT) {
            panic!("{}: did not change state: {err}", self.description);
        }
    }

    /// Receives the next stdout line, waiting at most until `deadline`.
    fn next_line(&mut self, deadline: Instant) -> Result<String, NoLine> {
        if self.stdout_closed {
            return Err(NoLine::Closed);
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                if self.history.len() == HISTORY_LINES {
                    self.history.pop_front();
                }
                self.history.push_back(line.clone());
                Ok(line)
            }
            Err(RecvTimeoutError::Timeout) => Err(NoLine::TimedOut),
            Err(RecvTimeoutError::Disconnected) => {
                self.stdout_closed = true;
                Err(NoLine::Closed)
            }
        }
    }

    /// The exit status if the child exits shortly, for panic messages.
    fn exit_status_hint(&mut self) -> String {
        match reap(&mut self.child, EXIT_STATUS_GRACE) {
            Ok(Some(status)) => format!("exited with {status}"),
            Ok(None) => "process still running".to_owned(),
            Err(err) => format!("exit status unknown: {err}"),
        }
    }

    fn recent_output(&self) -> String {
        if self.history.is_empty() {
            return "no stdout lines were seen".to_owned();
        }
        let mut out = format!("last {} stdout lines seen:", self.history.len());
        for line in &self.history {
            out.push_str("\n    ");
            out.push_str(line);
        }
        out
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // Errors are ignored: panicking here could abort a test that is
        // already unwinding.
        let _ = kill_and_reap(&mut self.child, REAP_TIMEOUT);
    }
}

/// Reader thread body: forwards stdout lines until EOF or until the
/// `ChildProcess` is gone.
///
/// A line starting with `libtest_header` is forwarded as two lines, the
/// header and the test's own output that followed it on the same line.
fn forward_lines(stdout: impl Read, tx: Sender<String>, libtest_header: Option<String>) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => return,
            Ok(_) => {
                // Lossy rather than failing: one stray non-UTF-8 byte must not
                // hide the result lines that follow it.
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                let glued = libtest_header
                    .as_deref()
                    .and_then(|header| Some((header, line.strip_prefix(header)?)))
                    .filter(|(_, rest)| !rest.is_empty());
                let sent = match glued {
                    Some((header, rest)) => tx
                        .send(header.trim_end().to_owned())
                        .and_then(|()| tx.send(rest.to_owned())),
                    None => tx.send(line.to_owned()),
                };
                if sent.is_err() {
                    return;
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// `line` without `prefix` (which it is known to start with), trimmed.
fn strip(line: &str, prefix: &str) -> String {
    line[prefix.len()..].trim().to_owned()
}

//! A throwaway `redis-server` process per test.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use crate::commandstats::{diff_calls, parse_commandstats};
use crate::launch::{
    connection_info, free_port, fresh_dir, launch, reset_dir, LaunchError, NOT_FOUND, REAP_TIMEOUT,
};
use crate::process::{kill_and_reap, signal_child, wait_for_stop_state};

/// Startup attempts before giving up. Retries exist because picking a port
/// by binding :0 and releasing it races with other tests doing the same.
const START_ATTEMPTS: u32 = 5;
/// Timeouts of connections handed to tests.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on SIGSTOP/SIGCONT becoming visible in the process state.
const SIGNAL_STATE_TIMEOUT: Duration = Duration::from_secs(5);

/// A throwaway `redis-server` child process on a free loopback port.
///
/// The server runs without persistence (`--save ""`, `--appendonly no`) in a
/// fresh temporary directory that also holds its log (`redis.log`) and, in
/// cluster mode, its `nodes.conf`. Dropping the value SIGKILLs the server,
/// reaps it and deletes the directory, also when the test is panicking.
///
/// All methods take `&self`, so one server can be shared between threads
/// (for example behind an `Arc`) while one thread pauses or restarts it.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// The text of a configuration file given on every launch, if any.
    config: Option<String>,
    state: Mutex<State>,
}

/// The part of a server that changes on `kill`/`restart`.
#[derive(Debug)]
struct State {
    /// `None` once the server was killed (and reaped).
    child: Option<Child>,
    /// Pid of the most recent process, kept after a kill for diagnostics.
    pid: u32,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers
    /// PING.
    ///
    /// # Panics
    ///
    /// Panics when `redis-server` is not on `PATH` (with a one-line hint on
    /// how to install it) or when the server fails to come up after a few
    /// attempts on different ports (with the tail of its log).
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments
    /// appended to the command line, e.g. `&["--cluster-enabled", "yes"]`.
    ///
    /// When cluster mode is enabled and no `--cluster-config-file` is given,
    /// `--cluster-config-file <dir>/nodes.conf` is added so parallel cluster
    /// nodes never share (and corrupt) a config file.
    ///
    /// # Panics
    ///
    /// Same as [`RedisServer::start`].
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::try_start_with(extra_args).unwrap_or_else(|err| panic!("{err}"))
    }

    /// Non-panicking [`RedisServer::start`], for examples that want to print
    /// a friendly message instead of a panic.
    ///
    /// The error is either the one-line "redis-server not found on PATH"
    /// hint or a description of the startup failure.
    pub fn try_start() -> Result<RedisServer, String> {
        Self::try_start_with(&[])
    }

    /// Non-panicking [`RedisServer::start_with`].
    pub fn try_start_with(extra_args: &[&str]) -> Result<RedisServer, String> {
        Self::try_start_configured(None, extra_args)
    }

    /// Starts a server that reads `config` (the text of a configuration
    /// file, written into its directory) before the usual arguments and
    /// `extra_args`: a sentinel is `start_configured("sentinel monitor …",
    /// &["--sentinel"])`.
    ///
    /// # Panics
    ///
    /// Same as [`RedisServer::start`].
    pub fn start_configured(config: &str, extra_args: &[&str]) -> RedisServer {
        Self::try_start_configured(Some(config), extra_args).unwrap_or_else(|err| panic!("{err}"))
    }

    fn try_start_configured(
        config: Option<&str>,
        extra_args: &[&str],
    ) -> Result<RedisServer, String> {
        let extra_args: Vec<String> = extra_args.iter().map(|arg| arg.to_string()).collect();
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port().map_err(|err| format!("cannot find a free port: {err}"))?;
            let dir = fresh_dir(port)
                .map_err(|err| format!("cannot create a temp dir for redis-server: {err}"))?;
            match launch(port, &dir, &extra_args, config) {
                Ok(child) => {
                    return Ok(RedisServer {
                        port,
                        dir,
                        extra_args,
                        config: config.map(str::to_owned),
                        state: Mutex::new(State {
                            pid: child.id(),
                            child: Some(child),
                        }),
                    });
                }
                Err(failure) => {
                    // The dir only held the log, whose tail is already in the
                    // error message.
                    let _ = fs::remove_dir_all(&dir);
                    match failure {
                        LaunchError::NotFound => return Err(NOT_FOUND.to_owned()),
                        LaunchError::Failed(reason) => {
                            failures.push(format!("attempt {attempt} (port {port}): {reason}"))
                        }
                    }
                }
            }
        }
        Err(format!(
            "redis-server did not come up after {START_ATTEMPTS} attempts\n{}",
            failures.join("\n")
        ))
    }

    /// The TCP port the server listens on (on 127.0.0.1). Stable across
    /// [`RedisServer::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pid of the current server process (of the last one after
    /// [`RedisServer::kill`]). Changes on [`RedisServer::restart`].
    pub fn pid(&self) -> u32 {
        self.lock().pid
    }

    /// Connection URL, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's private temporary directory (holds `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A fresh raw connection with 5 s read/write timeouts, for assertions.
    ///
    /// The connection skips redis-rs's `CLIENT SETINFO` handshake, so opening
    /// it adds nothing to `INFO commandstats` and does not disturb
    /// [`RedisServer::commands_since`].
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be reached (e.g. after a kill).
    pub fn connection(&self) -> redis::Connection {
        self.try_connection().unwrap_or_else(|err| {
            panic!(
                "cannot connect to the test redis-server on port {}: {err}",
                self.port
            )
        })
    }

    /// Non-panicking [`RedisServer::connection`], for asserting that the
    /// server is unreachable.
    pub fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(connection_info(self.port))?;
        let con = client.get_connection_with_timeout(IO_TIMEOUT)?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        con.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(con)
    }

    /// Freezes the server with SIGSTOP and waits until it is stopped.
    ///
    /// The kernel keeps accepting TCP connections into the listen backlog,
    /// but no command is answered until [`RedisServer::resume`].
    ///
    /// # Panics
    ///
    /// Panics when the server is not running.
    pub fn pause(&self) {
        self.signal_and_wait(libc::SIGSTOP, true);
    }

    /// Lets a paused server run again with SIGCONT.
    ///
    /// # Panics
    ///
    /// Panics when the server is not running.
    pub fn resume(&self) {
        self.signal_and_wait(libc::SIGCONT, false);
    }

    /// SIGKILLs the server and reaps it; afterwards the port refuses
    /// connections. Calling it again is a no-op.
    ///
    /// # Panics
    ///
    /// Panics if the process cannot be reaped within 10 s.
    pub fn kill(&self) {
        let mut state = self.lock();
        if let Some(mut child) = state.child.take() {
            if let Err(err) = kill_and_reap(&mut child, REAP_TIMEOUT) {
                panic!("cannot kill redis-server (pid {}): {err}", state.pid);
            }
        }
    }

    /// Kills the server (if still running) and starts a new one on the same
    /// port with the same arguments, waiting until it answers PING.
    ///
    /// All data is lost: the temp dir is emptied first, so cluster mode also
    /// starts over with a new `nodes.conf` and node id.
    ///
    /// # Panics
    ///
    /// Panics when the new server does not come up (with its log tail).
    pub fn restart(&self) {
        self.relaunch(true);
    }

    /// SIGKILLs the server (if still running) and starts a new one on the
    /// same port and directory, which loads the last snapshot written there
    /// (by `SAVE` or `BGSAVE`): Redis comes back with the data as of that
    /// snapshot, as after a crash of a server that persists with RDB.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::restart`].
    pub fn restart_keeping_data(&self) {
        self.relaunch(false);
    }

    fn relaunch(&self, forget_data: bool) {
        let mut state = self.lock();
        if let Some(mut child) = state.child.take() {
            if let Err(err) = kill_and_reap(&mut child, REAP_TIMEOUT) {
                panic!("cannot kill redis-server (pid {}): {err}", state.pid);
            }
        }
        if forget_data {
            if let Err(err) = reset_dir(&self.dir) {
                panic!("cannot empty {}: {err}", self.dir.display());
            }
        }
        // The port is fixed now, so retrying on it only helps if something
        // grabbed it in the short window since the kill; a few tries with a
        // growing pause give such a squatter time to go away.
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            match launch(
                self.port,
                &self.dir,
                &self.extra_args,
                self.config.as_deref(),
            ) {
                Ok(child) => {
                    state.pid = child.id();
                    state.child = Some(child);
                    return;
                }
                Err(LaunchError::NotFound) => panic!("{NOT_FOUND}"),
                Err(LaunchError::Failed(reason)) => {
                    failures.push(format!("attempt {attempt}: {reason}"));
                    thread::sleep(Duration::from_millis(20 * u64::from(attempt)));
                }
            }
        }
        panic!(
            "redis-server did not restart on port {} after {START_ATTEMPTS} attempts\n{}",
            self.port,
            failures.join("\n")
        );
    }

    /// Calls per command from `INFO commandstats`, e.g. `"evalsha" → 12`.
    ///
    /// Names are Redis's own (lower case; subcommands look like
    /// `"client|setname"`). Only commands called at least once since the
    /// (re)start appear.
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be queried.
    pub fn command_calls(&self) -> BTreeMap<String, u64> {
        let mut con = self.connection();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut con)
            .unwrap_or_else(|err| {
                panic!(
                    "INFO commandstats failed on the test redis-server on port {}: {err}",
                    self.port
                )
            });
        parse_commandstats(&info)
    }

    /// Commands called since the `before` snapshot taken with
    /// [`RedisServer::command_calls`], without the `info` calls made by the
    /// snapshots themselves. Commands with no new calls are left out.
    ///
    /// # Panics
    ///
    /// Panics when the server cannot be queried.
    pub fn commands_since(&self, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        diff_calls(before, self.command_calls())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock (e.g. a failed restart) must not
        // stop later calls, and above all `Drop`, from cleaning up.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn signal_and_wait(&self, signal: libc::c_int, stopped: bool) {
        let mut state = self.lock();
        let pid = state.pid;
        let Some(child) = state.child.as_mut() else {
            panic!("redis-server on port {} is not running (killed)", self.port);
        };
        match signal_child(child, signal) {
            Ok(true) => {}
            Ok(false) => panic!(
                "redis-server on port {} (pid {pid}) exited unexpectedly",
                self.port
            ),
            Err(err) => panic!("cannot signal redis-server (pid {pid}): {err}"),
        }
        if let Err(err) = wait_for_stop_state(pid, stopped, SIGNAL_STATE_TIMEOUT) {
            panic!("redis-server (pid {pid}) did not change state: {err}");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut child) = state.child.take() {
            // Errors are ignored: panicking here could abort a test that is
            // already unwinding, and there is nothing better to do anyway.
            let _ = kill_and_reap(&mut child, REAP_TIMEOUT);
        }
        if let Some(keep) = std::env::var_os("REDBATON_TEST_KEEP_LOGS") {
            let kept = std::path::Path::new(&keep).join(format!("{}.log", self.port));
            let _ = fs::copy(self.dir.join(crate::launch::LOG_FILE), kept);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

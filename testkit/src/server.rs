//! A throwaway `redis-server` process per test.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::process::{kill_and_reap, signal_child, wait_for_stop_state};

/// The one line shown when the binary is missing, so a contributor without
/// Redis installed immediately knows what to do.
const NOT_FOUND: &str = "redis-server not found on PATH: install it (Debian/Ubuntu: apt-get install redis-server) to run redbaton's tests";

/// How long a freshly spawned server gets to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between readiness probes: short, because startup normally takes a
/// few milliseconds and tests start many servers.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Connect timeout of a single readiness probe; loopback either accepts or
/// refuses almost instantly, so anything slower is worth another try.
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Read/write timeout of a single readiness probe.
const PROBE_IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Startup attempts before giving up. Retries exist because picking a port
/// by binding :0 and releasing it races with other tests doing the same.
const START_ATTEMPTS: u32 = 5;
/// Timeouts of connections handed to tests.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on reaping a SIGKILLed server, which normally takes microseconds.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on SIGSTOP/SIGCONT becoming visible in the process state.
const SIGNAL_STATE_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of the server log quoted in startup failures.
const LOG_TAIL_LINES: usize = 30;
const LOG_FILE: &str = "redis.log";

/// Distinguishes temp dirs of servers started by the same process that
/// happen to reuse a port (for example after a previous server was dropped).
static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

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

/// Why one startup attempt failed.
enum LaunchError {
    /// `redis-server` is not installed; retrying cannot help.
    NotFound,
    /// Anything else, with a human-readable reason including the log tail.
    Failed(String),
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
        let extra_args: Vec<String> = extra_args.iter().map(|arg| arg.to_string()).collect();
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port().map_err(|err| format!("cannot find a free port: {err}"))?;
            let dir = fresh_dir(port)
                .map_err(|err| format!("cannot create a temp dir for redis-server: {err}"))?;
            match launch(port, &dir, &extra_args) {
                Ok(child) => {
                    return Ok(RedisServer {
                        port,
                        dir,
                        extra_args,
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
            match launch(self.port, &self.dir, &self.extra_args) {
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
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Asks the kernel for a currently free loopback port.
///
/// The listener is closed before redis-server binds, so another process may
/// take the port in between; callers retry on failure.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Creates a new, empty, uniquely named directory for one server.
fn fresh_dir(port: u16) -> io::Result<PathBuf> {
    let counter = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "redbaton-testkit-{}-{port}-{counter}",
        std::process::id()
    ));
    // A leftover from a crashed earlier run with a recycled pid must not leak
    // old data or a stale nodes.conf into this server.
    match fs::remove_dir_all(&dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Empties `dir` by recreating it.
fn reset_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    fs::create_dir_all(dir)
}

/// The full `redis-server` command line for a server in `dir` on `port`.
fn server_args(port: u16, dir: &Path, extra_args: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--port".into(),
        port.to_string().into(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        "".into(),
        "--appendonly".into(),
        "no".into(),
        "--dir".into(),
        dir.into(),
        "--daemonize".into(),
        "no".into(),
    ];
    args.extend(extra_args.iter().map(OsString::from));
    if cluster_enabled(extra_args) && !extra_args.iter().any(|a| a == "--cluster-config-file") {
        args.push("--cluster-config-file".into());
        args.push(dir.join("nodes.conf").into());
    }
    args
}

/// Whether `extra_args` turn cluster mode on (`--cluster-enabled yes`).
fn cluster_enabled(extra_args: &[String]) -> bool {
    extra_args
        .windows(2)
        .any(|pair| pair[0] == "--cluster-enabled" && pair[1].eq_ignore_ascii_case("yes"))
}

/// Spawns one server and waits until it is ready, killing it on failure.
fn launch(port: u16, dir: &Path, extra_args: &[String]) -> Result<Child, LaunchError> {
    let log_path = dir.join(LOG_FILE);
    let open_log = || -> io::Result<(File, File)> {
        let log = File::create(&log_path)?;
        let log_err = log.try_clone()?;
        Ok((log, log_err))
    };
    let (log, log_err) = open_log().map_err(|err| {
        LaunchError::Failed(format!("cannot create {}: {err}", log_path.display()))
    })?;

    let mut child = Command::new("redis-server")
        .args(server_args(port, dir, extra_args))
        .stdin(Stdio::null())
        // Into the log file rather than inherited: parallel servers would
        // otherwise interleave their banners with the test output.
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|err| match err.kind() {
            io::ErrorKind::NotFound => LaunchError::NotFound,
            _ => LaunchError::Failed(format!("cannot spawn redis-server: {err}")),
        })?;

    match wait_ready(&mut child, port) {
        Ok(()) => Ok(child),
        Err(reason) => {
            let _ = kill_and_reap(&mut child, REAP_TIMEOUT);
            Err(LaunchError::Failed(format!(
                "{reason}\n--- last lines of {} ---\n{}",
                log_path.display(),
                log_tail(&log_path)
            )))
        }
    }
}

/// Polls until `child` answers PING on `port`, it exits, or the deadline
/// passes.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let pid = child.id();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(format!("redis-server exited during startup ({status})"))
            }
            Ok(None) => {}
            Err(err) => return Err(format!("cannot check on redis-server: {err}")),
        }
        let last_error = match probe(port, pid) {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "redis-server did not answer PING within {READY_TIMEOUT:?} (last error: {last_error})"
            ));
        }
        thread::sleep(READY_POLL_INTERVAL.min(deadline - now));
    }
}

/// One readiness check: PING must succeed, and the answering server must be
/// our child. The identity check matters because after a port race another
/// test's server may be the one listening; ours will then exit shortly with
/// "address in use" and the caller retries on a different port.
fn probe(port: u16, pid: u32) -> Result<(), String> {
    let client = redis::Client::open(connection_info(port)).map_err(|err| err.to_string())?;
    let mut con = client
        .get_connection_with_timeout(PROBE_CONNECT_TIMEOUT)
        .map_err(|err| err.to_string())?;
    con.set_read_timeout(Some(PROBE_IO_TIMEOUT))
        .and_then(|()| con.set_write_timeout(Some(PROBE_IO_TIMEOUT)))
        .map_err(|err| err.to_string())?;
    let pong: String = redis::cmd("PING")
        .query(&mut con)
        .map_err(|err| err.to_string())?;
    if pong != "PONG" {
        return Err(format!("unexpected PING reply {pong:?}"));
    }
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .map_err(|err| err.to_string())?;
    let answering = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("process_id:"))
        .and_then(|value| value.parse::<u32>().ok());
    match answering {
        Some(answering) if answering == pid => Ok(()),
        Some(answering) => Err(format!(
            "port {port} is answered by another redis-server (pid {answering})"
        )),
        None => Err("INFO server has no process_id".to_owned()),
    }
}

/// Connection settings for test-side connections to a local server.
fn connection_info(port: u16) -> ConnectionInfo {
    let info = ConnectionAddr::Tcp("127.0.0.1".to_owned(), port)
        .into_connection_info()
        .expect("a TCP address is always a valid connection info");
    // Without CLIENT SETINFO, opening a connection leaves commandstats
    // untouched (and Redis 7.0 does not know that subcommand anyway).
    info.set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name())
}

/// The last lines of the log, or why it could not be read.
fn log_tail(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            if lines.is_empty() {
                "(log is empty)".to_owned()
            } else {
                lines[start..].join("\n")
            }
        }
        Err(err) => format!("(cannot read log: {err})"),
    }
}

/// Parses `INFO commandstats` into command name → calls.
fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Per-command call increase from `before` to `after`, minus `info`.
///
/// Saturating because a restart between the snapshots resets the counters.
fn diff_calls(
    before: &BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .into_iter()
        .filter(|(name, _)| name != "info")
        .filter_map(|(name, calls)| {
            let new_calls = calls.saturating_sub(before.get(&name).copied().unwrap_or(0));
            (new_calls > 0).then_some((name, new_calls))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_parsed_by_name() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_client|setname:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_broken\r\n";
        let calls = parse_commandstats(info);
        assert_eq!(
            calls,
            BTreeMap::from([("client|setname".to_owned(), 2), ("evalsha".to_owned(), 12)])
        );
    }

    #[test]
    fn diff_skips_info_unchanged_and_reset_counters() {
        let before = BTreeMap::from([
            ("get".to_owned(), 5),
            ("info".to_owned(), 1),
            ("set".to_owned(), 9),
        ]);
        let after = BTreeMap::from([
            ("get".to_owned(), 5),
            ("info".to_owned(), 3),
            ("set".to_owned(), 2),
            ("blpop".to_owned(), 4),
        ]);
        assert_eq!(
            diff_calls(&before, after),
            BTreeMap::from([("blpop".to_owned(), 4)])
        );
    }

    #[test]
    fn cluster_mode_gets_a_private_config_file() {
        let dir = Path::new("/tmp/x");
        let args = server_args(1, dir, &["--cluster-enabled".into(), "yes".into()]);
        assert!(args.ends_with(&["--cluster-config-file".into(), "/tmp/x/nodes.conf".into()]));

        let args = server_args(1, dir, &["--maxmemory".into(), "1mb".into()]);
        assert!(!args.contains(&"--cluster-config-file".into()));
    }
}

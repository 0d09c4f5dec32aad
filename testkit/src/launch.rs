//! Starting one `redis-server` process: a free port, a private directory,
//! the command line, and waiting until it answers `PING` (with the tail of
//! its log when it does not).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::process::kill_and_reap;

/// Bound on reaping a SIGKILLed server, which normally takes microseconds.
pub(crate) const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// The one line shown when the binary is missing, so that someone without
/// Redis installed knows at once what to do; `$for` says what it is for.
macro_rules! not_found {
    ($for:literal) => {
        concat!(
            "redis-server not found on PATH (or at $REDBATON_TEST_SERVER): install it ",
            "(Debian/Ubuntu: apt-get install redis-server) ",
            $for
        )
    };
}

/// `not_found!` for the tests.
pub(crate) const NOT_FOUND: &str = not_found!("to run redbaton's tests");

/// `not_found!` for the examples and benches, which can also use a
/// running Redis instead.
pub(crate) const NOT_FOUND_FOR_EXAMPLES: &str = not_found!(
    "to run redbaton's examples and benches, or set REDIS_URL to use a Redis of your own"
);

/// Names the server binary the tests start instead of `redis-server` on
/// `PATH` (a Valkey `valkey-server`, a Redis built from source): every
/// server, replica, cluster node and sentinel of the suite is started from
/// it.
pub const SERVER_VAR: &str = "REDBATON_TEST_SERVER";

/// The server binary tests start: [`SERVER_VAR`] when set, else
/// `redis-server` on `PATH`.
pub fn server_binary() -> String {
    match std::env::var(SERVER_VAR) {
        Ok(path) if !path.is_empty() => path,
        _ => "redis-server".to_owned(),
    }
}

/// `<binary> --version`'s line, once per process, written straight to
/// stderr (not captured by the test harness) so that every test binary's
/// output says which server it ran against.
fn announce_server_once(binary: &str) {
    static ANNOUNCED: std::sync::Once = std::sync::Once::new();
    ANNOUNCED.call_once(|| {
        let version = server_version(binary).unwrap_or_else(|err| err);
        let _ = writeln!(
            io::stderr(),
            "testkit: test servers are {binary}: {version}"
        );
    });
}

/// The first line of `<binary> --version`.
pub fn server_version(binary: &str) -> Result<String, String> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|err| format!("cannot run {binary} --version: {err}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// The configuration file of a server started with one (a sentinel).
const CONFIG_FILE: &str = "redis.conf";

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

/// Lines of the server log quoted in startup failures.
const LOG_TAIL_LINES: usize = 30;

pub(crate) const LOG_FILE: &str = "redis.log";

/// Distinguishes temp dirs of servers started by the same process that
/// happen to reuse a port (for example after a previous server was dropped).
static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Why one startup attempt failed.
pub(crate) enum LaunchError {
    /// `redis-server` is not installed; retrying cannot help.
    NotFound,
    /// Anything else, with a human-readable reason including the log tail.
    Failed(String),
}

/// Asks the kernel for a currently free loopback port.
///
/// The listener is closed before redis-server binds, so another process may
/// take the port in between; callers retry on failure.
pub(crate) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Creates a new, empty, uniquely named directory for one server.
pub(crate) fn fresh_dir(port: u16) -> io::Result<PathBuf> {
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
pub(crate) fn reset_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    fs::create_dir_all(dir)
}

/// The full `redis-server` command line for a server in `dir` on `port`.
pub(crate) fn server_args(
    port: u16,
    dir: &Path,
    extra_args: &[String],
    config_file: Option<&Path>,
) -> Vec<OsString> {
    // A configuration file comes first, or redis-server does not read it.
    let mut args: Vec<OsString> = config_file.map(OsString::from).into_iter().collect();
    args.extend::<Vec<OsString>>(vec![
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
    ]);
    if !extra_args.iter().any(|a| a == "--sentinel") {
        // A replica's full sync starts at once instead of after the
        // default 5 s pause (kept for more replicas to join one diskless
        // transfer): a failover in a test then ends in well under a
        // second, not after the sentinels' failover-timeout.
        args.push("--repl-diskless-sync-delay".into());
        args.push("0".into());
    }
    args.extend(extra_args.iter().map(OsString::from));
    if cluster_enabled(extra_args) && !extra_args.iter().any(|a| a == "--cluster-config-file") {
        args.push("--cluster-config-file".into());
        args.push(dir.join("nodes.conf").into());
    }
    args
}

/// Whether `extra_args` turn cluster mode on (`--cluster-enabled yes`).
pub(crate) fn cluster_enabled(extra_args: &[String]) -> bool {
    extra_args
        .windows(2)
        .any(|pair| pair[0] == "--cluster-enabled" && pair[1].eq_ignore_ascii_case("yes"))
}

/// Spawns one server and waits until it is ready, killing it on failure.
pub(crate) fn launch(
    port: u16,
    dir: &Path,
    extra_args: &[String],
    config: Option<&str>,
) -> Result<Child, LaunchError> {
    let log_path = dir.join(LOG_FILE);
    let config_file = match config {
        Some(text) => {
            // Written afresh on every launch: a sentinel rewrites its own.
            let path = dir.join(CONFIG_FILE);
            fs::write(&path, text).map_err(|err| {
                LaunchError::Failed(format!("cannot write {}: {err}", path.display()))
            })?;
            Some(path)
        }
        None => None,
    };
    let open_log = || -> io::Result<(File, File)> {
        let log = File::create(&log_path)?;
        let log_err = log.try_clone()?;
        Ok((log, log_err))
    };
    let (log, log_err) = open_log().map_err(|err| {
        LaunchError::Failed(format!("cannot create {}: {err}", log_path.display()))
    })?;

    let binary = server_binary();
    announce_server_once(&binary);
    let mut child = Command::new(&binary)
        .args(server_args(port, dir, extra_args, config_file.as_deref()))
        .stdin(Stdio::null())
        // Into the log file rather than inherited: parallel servers would
        // otherwise interleave their banners with the test output.
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|err| match err.kind() {
            io::ErrorKind::NotFound => LaunchError::NotFound,
            _ => LaunchError::Failed(format!("cannot spawn {binary}: {err}")),
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
pub(crate) fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
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
pub(crate) fn probe(port: u16, pid: u32) -> Result<(), String> {
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
pub(crate) fn connection_info(port: u16) -> ConnectionInfo {
    let info = ConnectionAddr::Tcp("127.0.0.1".to_owned(), port)
        .into_connection_info()
        .expect("a TCP address is always a valid connection info");
    // Without CLIENT SETINFO, opening a connection leaves commandstats
    // untouched (and Redis 7.0 does not know that subcommand anyway).
    info.set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name())
}

/// The last lines of the log, or why it could not be read.
pub(crate) fn log_tail(path: &Path) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_mode_gets_a_private_config_file() {
        let dir = Path::new("/tmp/x");
        let args = server_args(1, dir, &["--cluster-enabled".into(), "yes".into()], None);
        assert!(args.ends_with(&["--cluster-config-file".into(), "/tmp/x/nodes.conf".into()]));

        let args = server_args(1, dir, &["--maxmemory".into(), "1mb".into()], None);
        assert!(!args.contains(&"--cluster-config-file".into()));
    }
}

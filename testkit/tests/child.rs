//! Exercises `ChildProcess` by re-executing this test binary.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use testkit::{pid_exists, ChildProcess, DemoRedis, RedisServer};

const ROLE: &str = "TESTKIT_CHILD_ROLE";
const WAIT: Duration = Duration::from_secs(10);

/// The child side: does what `TESTKIT_CHILD_ROLE` says and reports on
/// stdout. Ignored so it only runs when a parent asks for it.
#[test]
#[ignore = "child process entry point, run by the other tests"]
fn child_entry() {
    match std::env::var(ROLE).as_deref() {
        Ok("results") => {
            println!("RESULT: a");
            println!("some noise");
            println!("RESULT:  b  ");
            println!("DONE: 1");
        }
        Ok("try_start") => match RedisServer::try_start() {
            Ok(server) => println!("STARTED: {}", server.port()),
            Err(err) => println!("ERROR: {err}"),
        },
        Ok("demo") => {
            std::env::remove_var("REDIS_URL");
            match DemoRedis::from_env() {
                Ok(redis) => println!("STARTED: {}", redis.url),
                Err(err) => println!("ERROR: {err}"),
            }
        }
        Ok("ticker") => {
            // Runs until killed, but never longer than the deadline.
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut tick = 0u64;
            while Instant::now() < deadline {
                println!("TICK: {tick}");
                tick += 1;
                thread::sleep(Duration::from_millis(10));
            }
        }
        other => panic!("unknown role {other:?}"),
    }
}

fn panic_message(result: std::thread::Result<impl Sized>) -> String {
    let payload = match result {
        Ok(_) => panic!("expected a panic"),
        Err(payload) => payload,
    };
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn lines_are_matched_by_prefix_in_any_order() {
    let mut child = ChildProcess::spawn_test("child_entry", &[(ROLE, "results".to_owned())]);
    // Asking for the later line first must not lose the earlier ones.
    assert_eq!(child.wait_for_line("DONE:", WAIT), "1");
    assert_eq!(child.wait_for_line("RESULT:", WAIT), "a");
    assert_eq!(
        child.lines_with_prefix_until_exit("RESULT:", WAIT),
        vec!["b".to_owned()]
    );
}

#[test]
fn all_prefixed_lines_until_exit() {
    let mut child = ChildProcess::spawn_test("child_entry", &[(ROLE, "results".to_owned())]);
    assert_eq!(
        child.lines_with_prefix_until_exit("RESULT:", WAIT),
        vec!["a".to_owned(), "b".to_owned()]
    );
}

#[test]
fn missing_redis_server_is_one_clear_line() {
    let mut child = ChildProcess::spawn_test(
        "child_entry",
        &[
            (ROLE, "try_start".to_owned()),
            ("PATH", "/nonexistent-testkit-path".to_owned()),
            (testkit::SERVER_VAR, String::new()),
        ],
    );
    assert_eq!(
        child.wait_for_line("ERROR:", WAIT),
        "redis-server not found on PATH (or at $REDBATON_TEST_SERVER): install it (Debian/Ubuntu: apt-get install redis-server) to run redbaton's tests"
    );
}

#[test]
fn missing_redis_server_for_an_example_speaks_of_the_example() {
    let mut child = ChildProcess::spawn_test(
        "child_entry",
        &[
            (ROLE, "demo".to_owned()),
            ("PATH", "/nonexistent-testkit-path".to_owned()),
            (testkit::SERVER_VAR, String::new()),
        ],
    );
    assert_eq!(
        child.wait_for_line("ERROR:", WAIT),
        "redis-server not found on PATH (or at $REDBATON_TEST_SERVER): install it (Debian/Ubuntu: apt-get install redis-server) to run redbaton's examples and benches, or set REDIS_URL to use a Redis of your own"
    );
}

#[test]
fn stop_continue_and_kill() {
    let mut child = ChildProcess::spawn_test("child_entry", &[(ROLE, "ticker".to_owned())]);
    let pid = child.pid();
    child.wait_for_line("TICK:", WAIT);

    child.signal_stop();
    child.signal_continue();
    // Still alive and producing output after being continued.
    child.wait_for_line("TICK:", WAIT);

    child.kill();
    child.kill();
    assert!(!pid_exists(pid));
}

#[test]
fn drop_kills_a_stopped_child() {
    let mut child = ChildProcess::spawn_test("child_entry", &[(ROLE, "ticker".to_owned())]);
    let pid = child.pid();
    child.wait_for_line("TICK:", WAIT);
    child.signal_stop();
    drop(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_exists(pid) {
        assert!(Instant::now() < deadline, "pid {pid} survived drop");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn spawn_command_reports_unsuccessful_exit() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo 'R: x'; exit 3"]);
    let mut child = ChildProcess::spawn_command(cmd);
    let message = panic_message(catch_unwind(AssertUnwindSafe(|| {
        child.lines_with_prefix_until_exit("R:", WAIT)
    })));
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("R: x"), "{message}");
}

#[test]
fn wait_for_line_times_out_with_the_lines_seen() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo hello; exec sleep 30"]);
    let mut child = ChildProcess::spawn_command(cmd);
    let message = panic_message(catch_unwind(AssertUnwindSafe(|| {
        child.wait_for_line("NEVER:", Duration::from_millis(200))
    })));
    assert!(message.contains("within 200ms"), "{message}");
    assert!(message.contains("hello"), "{message}");
}

#[test]
fn wait_for_line_panics_when_stdout_closes_first() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo bye"]);
    let mut child = ChildProcess::spawn_command(cmd);
    let message = panic_message(catch_unwind(AssertUnwindSafe(|| {
        child.wait_for_line("NEVER:", WAIT)
    })));
    assert!(message.contains("stdout closed"), "{message}");
    assert!(message.contains("bye"), "{message}");
}

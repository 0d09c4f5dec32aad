//! Exercises `RedisServer` against real redis-server processes.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use testkit::{pid_exists, RedisServer};

fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(con)
}

#[test]
fn parallel_servers_get_different_ports_and_answer_ping() {
    let handles: Vec<_> = (0..2).map(|_| thread::spawn(RedisServer::start)).collect();
    let servers: Vec<RedisServer> = handles
        .into_iter()
        .map(|handle| handle.join().expect("server start panicked"))
        .collect();

    assert_ne!(servers[0].port(), servers[1].port());
    assert_ne!(servers[0].pid(), servers[1].pid());
    for server in &servers {
        assert_eq!(ping(&mut server.connection()).unwrap(), "PONG");
        assert_eq!(
            server.url(),
            format!("redis://127.0.0.1:{}/", server.port())
        );
        // The URL must work for ordinary clients, not just for ours.
        let client = redis::Client::open(server.url()).unwrap();
        let mut con = client.get_connection().unwrap();
        assert_eq!(ping(&mut con).unwrap(), "PONG");
    }
}

#[test]
fn kill_makes_the_port_refuse_connections() {
    let server = RedisServer::start();
    let port = server.port();
    server.kill();
    // Idempotent: a second kill must neither panic nor signal a stranger.
    server.kill();

    let err = TcpStream::connect(("127.0.0.1", port)).expect_err("port still accepts");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(server.try_connection().is_err());
}

#[test]
fn restart_loses_data_but_keeps_the_port() {
    let server = RedisServer::start();
    let port = server.port();
    let old_pid = server.pid();
    let _: () = redis::cmd("SET")
        .arg("key")
        .arg("value")
        .query(&mut server.connection())
        .unwrap();

    server.restart();

    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(!pid_exists(old_pid));
    let value: Option<String> = redis::cmd("GET")
        .arg("key")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(value, None);
}

#[test]
fn restart_after_kill_brings_the_server_back() {
    let server = RedisServer::start();
    server.kill();
    server.restart();
    assert_eq!(ping(&mut server.connection()).unwrap(), "PONG");
}

#[test]
fn paused_server_times_out_and_answers_after_resume() {
    let server = RedisServer::start();
    let mut con = server.connection();
    con.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    server.pause();
    let started = Instant::now();
    let err = ping(&mut con).expect_err("a paused server answered");
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    assert!(started.elapsed() >= Duration::from_millis(250));

    server.resume();
    // The old connection may still have the late PONG in flight, so check
    // with a fresh one.
    let mut fresh = server.connection();
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
}

#[test]
fn commands_since_counts_exactly_the_commands_sent() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let before = server.command_calls();

    for i in 0..3 {
        let _: () = redis::cmd("SET").arg("k").arg(i).query(&mut con).unwrap();
    }

    let since = server.commands_since(&before);
    assert_eq!(
        since.into_iter().collect::<Vec<_>>(),
        [("set".to_owned(), 3)]
    );
    assert!(server.command_calls()["set"] >= 3);
}

#[test]
fn drop_kills_the_process_and_removes_the_dir() {
    let server = RedisServer::start();
    let pid = server.pid();
    let dir = server.dir().to_owned();
    assert!(pid_exists(pid));
    assert!(dir.join("redis.log").is_file());

    drop(server);

    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "pid {pid} still exists after drop"
        );
        thread::sleep(Duration::from_millis(5));
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn drop_cleans_up_when_the_test_panics() {
    let mut seen = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = RedisServer::start();
        seen = Some((server.pid(), server.dir().to_owned()));
        // Paused servers must still be killable by Drop.
        server.pause();
        panic!("simulated test failure");
    }));
    assert!(result.is_err());

    let (pid, dir) = seen.expect("server started");
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_exists(pid) {
        assert!(Instant::now() < deadline, "pid {pid} survived the panic");
        thread::sleep(Duration::from_millis(5));
    }
    assert!(!dir.exists());
}

#[test]
fn cluster_mode_keeps_its_config_in_the_temp_dir() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let mut con = server.connection();
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
    assert!(info.contains("cluster_enabled:1") || info.contains("cluster_state:"));
    let config_file: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("cluster-config-file")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        config_file[1],
        server.dir().join("nodes.conf").to_str().unwrap()
    );
    assert!(server.dir().join("nodes.conf").is_file());

    // Extra args survive a restart.
    server.restart();
    let enabled: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("cluster-enabled")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(enabled[1], "yes");
}

#[test]
fn bad_arguments_fail_with_the_server_log() {
    let err = RedisServer::try_start_with(&["--no-such-option", "1"])
        .expect_err("redis-server accepted a bogus option");
    assert!(err.contains("did not come up"), "{err}");
    assert!(err.contains("no-such-option"), "log tail missing: {err}");
}

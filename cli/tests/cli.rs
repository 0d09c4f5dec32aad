//! The `redbaton` binary against a real server: what it lists and shows of
//! locks held by another client, and force-unlock with and without
//! confirmation.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;

const HOLDER_NAME: &str = "billing-worker-7";
const LEASE: Duration = Duration::from_secs(30);

/// Runs the binary with `args`, `stdin` as its input.
fn redbaton(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redbaton"))
        .args(args)
        .env_remove("REDBATON_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().expect("piped stdin");
    // A command that does not read its input may have exited already.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("the binary ends")
}

/// The header of `list`.
const HEADER: [&str; 7] = ["KIND", "NAME", "CLIENT", "HOLDS", "TOKEN", "LEASE", "OWNER"];

/// A lease column: some time left, at most `LEASE`.
fn assert_lease(column: &str) {
    let lease: f64 = column.strip_suffix('s').unwrap().parse().unwrap();
    assert!(lease > 0.0 && lease <= LEASE.as_secs_f64(), "lease {lease}");
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

fn holder_client(server: &RedisServer) -> Client {
    Client::builder(server.url().as_str())
        .client_name(HOLDER_NAME)
        .default_lease(LEASE)
        .build()
        .unwrap()
}

#[test]
fn list_shows_each_held_lock_with_its_holder() {
    let server = RedisServer::start();
    let client = holder_client(&server);
    // Braces and a percent sign: stored escaped, listed as given.
    let name = "jobs:{7}%";
    let lock = client.lock(name).unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let token = outer.fencing_token();
    // Held too, but outside the pattern; and a free lock is not listed.
    let _other = client.lock("reports").unwrap().lock().unwrap();
    client
        .lock("jobs:free")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();

    let url = server.url();
    let output = redbaton(&["--url", &url, "list", "jobs:*"], "");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = stdout(&output);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 2, "a header and one lock: {text}");
    assert_eq!(rows[0], HEADER);
    let row = &rows[1];
    assert_eq!(
        row[..5],
        ["lock", name, HOLDER_NAME, "2", &token.to_string()]
    );
    assert_lease(row[5]);
    let holder = lock.holder().unwrap().unwrap();
    assert_eq!(row[6], holder.owner.as_str());

    // Without a pattern: both held locks, sorted.
    let all = stdout(&redbaton(&["--url", &url, "list"], ""));
    let names: Vec<&str> = all
        .lines()
        .skip(1)
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    assert_eq!(names, [name, "reports"]);

    // Another prefix sees none of them.
    let elsewhere = stdout(&redbaton(&["--url", &url, "--prefix", "other", "list"], ""));
    assert_eq!(elsewhere.lines().count(), 1, "{elsewhere}");
    drop(inner);
    drop(outer);
}

#[test]
fn list_shows_every_kind_held_with_its_holders() {
    let server = RedisServer::start();
    let client = holder_client(&server);
    let fair = client.fair_lock("queue").unwrap().lock().unwrap();
    let writer = client.rw_lock("table").unwrap().write().unwrap();
    let reader = client.rw_lock("shared").unwrap().read().unwrap();
    let pool = client.semaphore("pool").unwrap();
    assert_eq!(pool.try_set_permits(3).unwrap(), 3);
    let permits = pool.acquire_many(2).unwrap();
    let latch = client.count_down_latch("gate").unwrap();
    assert!(latch.try_set_count(2).unwrap());
    // Nothing held: not listed.
    let idle = client.semaphore("idle").unwrap();
    assert_eq!(idle.try_set_permits(1).unwrap(), 1);
    client
        .rw_lock("free")
        .unwrap()
        .write()
        .unwrap()
        .unlock()
        .unwrap();
    let opened = client.count_down_latch("open").unwrap();
    assert!(opened.try_set_count(1).unwrap());
    opened.count_down().unwrap();

    let output = redbaton(&["--url", &server.url(), "list"], "");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = stdout(&output);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows[0], HEADER, "{text}");
    // Every hold here is the test thread's: one owner identity.
    let owner = client
        .fair_lock("queue")
        .unwrap()
        .holder()
        .unwrap()
        .unwrap()
        .owner;
    let held: Vec<[&str; 5]> = rows[1..]
        .iter()
        .map(|row| [row[0], row[1], row[2], row[3], row[4]])
        .collect();
    let (fair_token, write_token) = (
        fair.fencing_token().to_string(),
        writer.fencing_token().to_string(),
    );
    assert_eq!(
        held,
        [
            ["fair_lock", "queue", HOLDER_NAME, "1", fair_token.as_str()],
            // Sorted by kind, then name.
            ["read", "shared", HOLDER_NAME, "1", rows[2][4]],
            ["write", "table", HOLDER_NAME, "1", write_token.as_str()],
            ["permits", "pool", HOLDER_NAME, "2", "-"],
            ["latch", "gate", "-", "2", "-"],
        ],
        "{text}"
    );
    for row in &rows[1..5] {
        assert_lease(row[5]);
        assert_eq!(row[6], owner.as_str(), "{text}");
    }
    assert!(rows[2][4].parse::<u64>().is_ok(), "a read token: {text}");
    assert_eq!(rows[5][5..], ["-", "-"], "{text}");

    // The pattern applies to every kind.
    let some = stdout(&redbaton(&["--url", &server.url(), "list", "[pt]*"], ""));
    let names: Vec<&str> = some
        .lines()
        .skip(1)
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    assert_eq!(names, ["table", "pool"], "{some}");
    drop((fair, writer, reader, permits));
}

#[test]
fn show_semaphore_and_latch_report_their_state() {
    let server = RedisServer::start();
    let client = holder_client(&server);
    let url = server.url();
    let guard = client.lock("one").unwrap().lock().unwrap();
    let shown = stdout(&redbaton(&["--url", &url, "show", "one"], ""));
    assert!(
        shown.contains(&format!("client: {HOLDER_NAME}\n")),
        "{shown}"
    );
    assert!(shown.contains("depth: 1\n"), "{shown}");
    assert!(
        shown.contains(&format!("token: {}\n", guard.fencing_token())),
        "{shown}"
    );
    let free = stdout(&redbaton(&["--url", &url, "show", "two"], ""));
    assert!(free.contains("held: no"), "{free}");

    // A fair lock: its holder and its queue (a waiter of another client).
    let fair = client.fair_lock("queue").unwrap();
    let fair_guard = fair.lock().unwrap();
    let waiter = holder_client(&server).fair_lock("queue").unwrap();
    let waiting = std::thread::spawn(move || {
        waiter
            .try_lock_for(Duration::from_secs(20))
            .map(|got| got.is_some())
    });
    let mut looks = 0;
    let text = loop {
        let text = stdout(&redbaton(&["--url", &url, "fair", "queue"], ""));
        looks += 1;
        if text.contains("waiters: 1\n") || looks == 200 {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.contains("waiters: 1\n"), "{text}");
    assert!(text.contains(&format!("client: {HOLDER_NAME}\n")), "{text}");
    drop(fair_guard);
    assert!(waiting.join().unwrap().unwrap());

    let semaphore = client.semaphore("pool").unwrap();
    assert_eq!(semaphore.try_set_permits(3).unwrap(), 3);
    let _permit = semaphore.acquire().unwrap();
    let sem = stdout(&redbaton(&["--url", &url, "semaphore", "pool"], ""));
    assert!(sem.contains("total permits: 3\n"), "{sem}");
    assert!(sem.contains("available permits: 2\n"), "{sem}");

    let latch = client.count_down_latch("start").unwrap();
    assert!(latch.try_set_count(4).unwrap());
    latch.count_down().unwrap();
    let count = stdout(&redbaton(&["--url", &url, "latch", "start"], ""));
    assert!(count.contains("count: 3\n"), "{count}");
}

#[test]
fn force_unlock_frees_only_when_confirmed() {
    let server = RedisServer::start();
    let client = holder_client(&server);
    let url = server.url();
    let lock = client.lock("stuck").unwrap();
    let guard = lock.lock().unwrap();
    let token = guard.fencing_token();

    // A wrong confirmation, then none at all: the lock stays as it was.
    for input in ["stuc\n", ""] {
        let refused = redbaton(&["--url", &url, "force-unlock", "stuck"], input);
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        assert!(stdout(&refused).contains("Type the name to confirm"));
        let holder = lock.holder().unwrap().expect("still held");
        assert_eq!(holder.fencing_token, token);
    }

    // The name typed: removed.
    let typed = redbaton(&["--url", &url, "force-unlock", "stuck"], "stuck\n");
    assert_eq!(typed.status.code(), Some(0), "{typed:?}");
    assert!(!lock.is_locked().unwrap());
    drop(guard);

    // --yes asks nothing.
    let guard = lock.lock().unwrap();
    let forced = redbaton(&["--url", &url, "force-unlock", "stuck", "--yes"], "");
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    assert!(!stdout(&forced).contains("Type the name"));
    assert!(!lock.is_locked().unwrap());
    assert!(
        guard.unlock().is_err(),
        "its holder learns it lost the lock"
    );

    // A fair lock, by its own keys.
    let fair = client.fair_lock("stuck").unwrap();
    let _fair_held = fair.lock().unwrap();
    let forced = redbaton(
        &["--url", &url, "force-unlock", "--fair", "stuck", "--yes"],
        "",
    );
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    assert!(!fair.is_locked().unwrap());
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    for args in [
        &[][..],
        &["list"][..],
        &["--url", "redis://127.0.0.1:1", "frobnicate"][..],
        &["--url", "redis://127.0.0.1:1", "show"][..],
        &["--url", "redis://127.0.0.1:1", "list", "--yes"][..],
        &["--url"][..],
    ] {
        let output = redbaton(args, "");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty());
        assert!(String::from_utf8_lossy(&output.stderr).contains("--help"));
    }
    let help = redbaton(&["--help"], "");
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("force-unlock NAME"));
}

#[test]
fn an_unreachable_server_fails_with_exit_1() {
    // A port nothing listens on: the listener is closed before the run.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let output = redbaton(&["--url", &url, "list"], "");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(!output.stderr.is_empty());
}

/// Each deployment option reaches the locks of its deployment: on a
/// Cluster the names fall on every master, and all are listed.
#[test]
fn every_deployment_option_lists_its_locks() {
    let names = ["a", "b", "c", "d", "e"];
    let cluster = testkit::RedisCluster::start(3, 0);
    let sentinels = testkit::RedisSentinels::start("locks", 1, 3);
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let master_urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    // The names' slots are served by every master of the cluster.
    let mut ports: Vec<u16> = names
        .iter()
        .map(|name| {
            let slot = cluster.slot_of(&format!("redbaton:{{{name}}}:lock"));
            cluster.master_of_slot(slot).port()
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "the names fall on every master");
    let cases = [
        (
            redbaton::Topology::cluster(cluster.seed_urls()),
            vec!["--cluster".to_owned(), cluster.seed_urls().join(",")],
            HOLDER_NAME,
        ),
        (
            redbaton::Topology::sentinel("locks", sentinels.sentinel_urls()),
            vec![
                "--sentinel".to_owned(),
                "locks".to_owned(),
                sentinels.sentinel_urls().join(","),
            ],
            HOLDER_NAME,
        ),
        // A quorum's holders have no client name on record.
        (
            redbaton::Topology::masters(master_urls.clone()),
            vec!["--masters".to_owned(), master_urls.join(",")],
            "-",
        ),
    ];
    for (topology, options, client_name) in cases {
        let client = Client::builder(topology)
            .client_name(HOLDER_NAME)
            .build()
            .unwrap();
        let guards: Vec<_> = names
            .iter()
            .map(|name| client.lock(name).unwrap().lock().unwrap())
            .collect();
        let mut args: Vec<&str> = options.iter().map(String::as_str).collect();
        args.push("list");
        let output = redbaton(&args, "");
        assert_eq!(output.status.code(), Some(0), "{options:?}: {output:?}");
        let text = stdout(&output);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip(1)
            .map(|line| line.split('\t').collect())
            .collect();
        let listed: Vec<&str> = rows.iter().map(|row| row[1]).collect();
        assert_eq!(listed, names, "{options:?}: {text}");
        for (row, guard) in rows.iter().zip(&guards) {
            assert_eq!(row[0], "lock", "{options:?}: {text}");
            assert_eq!(row[2], client_name, "{options:?}: {text}");
            assert_eq!(row[4], guard.fencing_token().to_string(), "{text}");
        }
        drop(guards);
    }
}

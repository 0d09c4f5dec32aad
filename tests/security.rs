//! Least privilege and secrets: redbaton works under an ACL user limited to
//! what it needs, names what is missing otherwise, and never shows a password.

mod support;

use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::Duration;

use redbaton::{Client, Error};
use support::JoinWithin;
use testkit::RedisServer;

/// The documented ACL line (docs/security.md), minus `ACL SETUSER <name>
/// on >password`: read from the page itself, so that the documented line
/// is the tested one.
fn redbaton_acl() -> &'static str {
    const LINE_START: &str = "ACL SETUSER locker on >long-random-password ";
    include_str!("../docs/security.md")
        .lines()
        .find_map(|line| line.strip_prefix(LINE_START))
        .expect("docs/security.md documents the ACL line")
}
const PASSWORD: &str = "pa55-w0rd-do-not-log";

fn add_user(server: &RedisServer, name: &str, rules: &str) {
    let mut raw = server.connection();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("on")
        .arg(format!(">{PASSWORD}"));
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    cmd.query::<()>(&mut raw).unwrap();
}

fn user_url(server: &RedisServer, user: &str, password: &str) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{}/", server.port())
}

/// Records every log line of this test binary.
struct Recorder(Mutex<Vec<String>>);

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

static LOGS: Recorder = Recorder(Mutex::new(Vec::new()));

fn record_logs() {
    let _ = log::set_logger(&LOGS);
    log::set_max_level(log::LevelFilter::Trace);
}

#[test]
fn everything_works_under_a_user_limited_to_the_documented_acl() {
    let server = RedisServer::start();
    add_user(&server, "locker", redbaton_acl());
    let client = Client::builder(user_url(&server, "locker", PASSWORD))
        .default_lease(Duration::from_millis(300))
        .max_park(Duration::from_millis(200))
        .build()
        .unwrap();
    let lock = client.lock("acl").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.try_lock().unwrap().expect("re-entry");
    assert_eq!(lock.holder().unwrap().unwrap().depth, 2);
    assert!(outer.remaining_lease().unwrap() > Duration::ZERO);

    // A waiter parks (BLPOP) and is woken by the release (RPUSH).
    let waiter = lock.clone();
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        tx.send(
            waiter
                .try_lock_for(Duration::from_secs(5))
                .map(|g| g.is_some()),
        )
        .unwrap()
    });
    // The watchdog renews meanwhile (lease 300 ms).
    support::eventually(Duration::from_secs(3), "a renewal", || {
        client.watchdog_stats().renewals >= 2
    });
    drop(inner);
    outer.extend(Duration::from_secs(1)).unwrap();
    outer.unlock().unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap());
    handle.joined();
    assert!(!lock.force_unlock().unwrap());
    assert!(!lock.is_locked().unwrap());
    assert_eq!(client.watchdog_stats().losses, 0);
}

#[test]
fn a_missing_permission_is_named_in_the_error() {
    let server = RedisServer::start();
    // `BLPOP` is needed only where tracking is refused too (a waiter then
    // parks in it).
    for (user, missing, also) in [
        ("no-hset", "+hset", None),
        ("no-blpop", "+blpop", Some("+client|tracking")),
        ("other-keys", "~redbaton:*", None),
    ] {
        let mut rules = redbaton_acl().replace(
            missing,
            if missing.starts_with('~') {
                "~elsewhere:*"
            } else {
                ""
            },
        );
        if let Some(also) = also {
            rules = rules.replace(also, "");
        }
        add_user(&server, user, &rules);
        let client = Client::open(&user_url(&server, user, PASSWORD)).unwrap();
        let lock = client.lock("denied").unwrap();
        let outcome = match lock.try_lock() {
            // Only waiting needs BLPOP: make this one wait.
            Ok(Some(held)) => {
                let other = lock.clone();
                let waited = thread::spawn(move || {
                    other
                        .try_lock_for(Duration::from_secs(2))
                        .map(|g| g.is_some())
                });
                let result = waited.joined();
                drop(held);
                result
            }
            other => other.map(|g| g.is_some()),
        };
        let err = outcome.unwrap_err();
        assert!(
            matches!(err, Error::PermissionDenied { .. }),
            "{user}: {err}"
        );
        let named = missing
            .trim_start_matches(['+', '~'])
            .trim_end_matches(":*");
        let message = err.to_string().to_lowercase();
        assert!(
            message.contains(named) || (named == "redbaton" && message.contains("key")),
            "{user}: {message}"
        );
    }
}

#[test]
fn passwords_stay_out_of_debug_errors_and_logs() {
    record_logs();
    let server = RedisServer::start();
    add_user(&server, "locker", redbaton_acl());

    let builder = Client::builder(user_url(&server, "locker", "wrong-secret-xyz"));
    let shown = format!("{builder:?}");
    let client = builder.build().unwrap();
    let shown = shown + &format!("{client:?}");
    let err = client.lock("secret").unwrap().try_lock().unwrap_err();
    assert!(matches!(err, Error::AuthenticationFailed { .. }), "{err}");
    let shown = shown + &format!("{err} {err:?}");

    let good = Client::open(&user_url(&server, "locker", PASSWORD)).unwrap();
    let lock = good.lock("secret").unwrap();
    let guard = lock.lock().unwrap();
    let shown = shown + &format!("{good:?} {lock:?} {guard:?}");
    drop(guard);
    server.kill();
    let down = lock.try_lock().unwrap_err();
    let shown = shown + &format!("{down} {down:?}");

    let logs = LOGS.0.lock().unwrap().join("\n");
    for secret in ["wrong-secret-xyz", PASSWORD] {
        assert!(!shown.contains(secret), "{secret} shown in: {shown}");
        assert!(!logs.contains(secret), "{secret} logged in: {logs}");
    }
}

/// Issue 21, item 12: the documented user may read `maxmemory-policy`, so
/// the eviction check runs; a user that may not gets a warning saying the
/// check could not run (not a debug line nobody sees).
#[test]
fn the_eviction_check_runs_under_the_documented_acl_and_warns_when_refused() {
    record_logs();
    let server = RedisServer::start();
    add_user(&server, "locker", redbaton_acl());
    let before = server.command_calls();
    let client = Client::open(&user_url(&server, "locker", PASSWORD)).unwrap();
    drop(client.lock("evict").unwrap().lock().unwrap());
    let calls = server.commands_since(&before);
    assert_eq!(calls.get("config|get"), Some(&1), "{calls:?}");

    let no_config = redbaton_acl().replace("+config|get", "");
    add_user(&server, "no-config", &no_config);
    let client = Client::open(&user_url(&server, "no-config", PASSWORD)).unwrap();
    drop(client.lock("evict").unwrap().lock().unwrap());
    let addr = format!("127.0.0.1:{}", server.port());
    let logs = LOGS.0.lock().unwrap().clone();
    let warned: Vec<_> = logs
        .iter()
        .filter(|line| line.starts_with("WARN") && line.contains("maxmemory-policy"))
        .filter(|line| line.contains(&addr))
        .collect();
    assert_eq!(warned.len(), 1, "{logs:#?}");
    assert!(warned[0].contains("could not") || warned[0].contains("not checked"));
}

/// The names of the connections to `server` other than the test's own
/// `admin`, from `CLIENT LIST`. One connection does all the test's looking
/// (a connection it dropped may still be listed for a moment, on Valkey).
fn connection_names(admin: &mut redis::Connection) -> Vec<String> {
    let own: i64 = redis::cmd("CLIENT").arg("ID").query(admin).unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
    let own = format!("id={own} ");
    list.lines()
        .filter(|line| !line.starts_with(&own))
        .filter_map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("name="))
                .map(str::to_owned)
        })
        .collect()
}

/// Issue 25, item 4: an operator reading `CLIENT LIST` can tell which host
/// and process each connection belongs to: every connection a client opens
/// (commands and parking) carries its name, `redbaton:<host>:<pid>` unless
/// set.
#[test]
fn every_connection_is_named_for_the_operator() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let lock = client.lock("named").unwrap();
    let held = lock.lock().unwrap();
    // A waiter parks, on the parking hub's connections.
    let waiter = {
        let client = Client::open(&server.url()).unwrap();
        thread::spawn(move || {
            let lock = client.lock("named").unwrap();
            lock.try_lock_for(Duration::from_secs(5))
                .map(|guard| guard.is_some())
        })
    };
    let mut admin = server.connection();
    support::eventually(Duration::from_secs(5), "a parked waiter", || {
        support::parked(&server) == 1
    });
    let expected = format!("redbaton:{}:{}", hostname(), std::process::id());
    // The test's own connections for `parked` close as they are dropped,
    // unnamed; the server may list the last one for a moment. A
    // connection of the clients' without its name would stay.
    support::eventually(Duration::from_secs(5), "only named connections", || {
        connection_names(&mut admin)
            .iter()
            .all(|name| *name == expected)
    });
    let names = connection_names(&mut admin);
    assert!(names.len() >= 2, "{names:?}");
    assert!(names.iter().all(|name| *name == expected), "{names:?}");
    drop(held);
    assert!(waiter.joined().unwrap());

    let custom = Client::builder(server.url())
        .client_name("billing-worker-7")
        .build()
        .unwrap();
    drop(custom.lock("custom").unwrap().lock().unwrap());
    assert!(connection_names(&mut server.connection()).contains(&"billing-worker-7".to_owned()));

    for bad in ["", "has space", "new\nline", &"x".repeat(129)] {
        let built = Client::builder(server.url()).client_name(bad).build();
        assert!(
            matches!(built, Err(redbaton::Error::InvalidConfig(_))),
            "{bad:?}: {built:?}"
        );
    }
}

/// The host as the default name spells it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .chars()
        .take(64)
        .map(|c| if c.is_ascii_graphic() { c } else { '-' })
        .collect()
}

/// A user whose ACL refuses `CLIENT SETNAME` still works, with unnamed
/// connections and one warning.
#[test]
fn a_refused_client_name_is_one_warning_not_a_failure() {
    record_logs();
    let server = RedisServer::start();
    let no_name = redbaton_acl().replace("+client|setname", "");
    add_user(&server, "no-name", &no_name);
    let client = Client::builder(user_url(&server, "no-name", PASSWORD))
        .client_name("refused-name")
        .build()
        .unwrap();
    let lock = client.lock("unnamed").unwrap();
    for _ in 0..3 {
        drop(lock.lock().unwrap());
    }
    assert!(!connection_names(&mut server.connection()).contains(&"refused-name".to_owned()));
    let logs = LOGS.0.lock().unwrap().clone();
    let warned = logs
        .iter()
        .filter(|line| line.starts_with("WARN") && line.contains("CLIENT SETNAME"))
        .count();
    assert_eq!(warned, 1, "{logs:#?}");
}

/// Issue 25, item 4: `holder()` names the holding client, as its own
/// client set it, to any client that asks; the name lives in one key per
/// client instance, with a TTL, and is written once (not per acquisition).
#[test]
fn the_holder_shows_its_clients_name() {
    let server = RedisServer::start();
    let holder_client = Client::builder(server.url())
        .client_name("inventory-worker-3")
        .build()
        .unwrap();
    let lock = holder_client.lock("stock").unwrap();
    drop(lock.lock().unwrap());
    let records: Vec<String> = redis::cmd("KEYS")
        .arg("redbaton:{redbaton:identity}:client:*")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let ttl = |server: &RedisServer| -> i64 {
        redis::cmd("PTTL")
            .arg(&records[0])
            .query(&mut server.connection())
            .unwrap()
    };
    let first = ttl(&server);
    assert!(first > 0, "the record expires: {first}");
    // Not written again by later acquisitions: its TTL only runs down.
    support::eventually(Duration::from_secs(2), "a millisecond passes", || {
        ttl(&server) < first
    });
    for _ in 0..5 {
        drop(lock.lock().unwrap());
    }
    assert!(ttl(&server) < first, "rewritten by an acquisition");
    let held = lock.lock().unwrap();
    let observer = Client::open(&server.url()).unwrap();
    let seen = observer.lock("stock").unwrap().holder().unwrap().unwrap();
    assert_eq!(seen.client_name.as_deref(), Some("inventory-worker-3"));
    drop(held);
}

/// Under the documented ACL without tracking (`+client|tracking` taken
/// out), waiters still wake at their release: the client warns once and
/// parks each waiter in `BLPOP` on a connection of its own.
#[test]
fn without_tracking_each_waiter_parks_in_blpop_and_wakes_at_its_release() {
    const NAMES: usize = 4;
    record_logs();
    let server = RedisServer::start();
    let rules = redbaton_acl().replace("+client|tracking ", "");
    assert_ne!(rules, redbaton_acl(), "the documented line allows tracking");
    add_user(&server, "no-tracking", &rules);
    let holder = Client::open(&server.url()).unwrap();
    // A long maximum park: a waiter woken only by looking again would
    // wait seconds.
    let waiting = Client::builder(user_url(&server, "no-tracking", PASSWORD))
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap();
    let names: Vec<String> = (0..NAMES).map(|n| format!("untracked:{n}")).collect();
    let guards: Vec<_> = names
        .iter()
        .map(|name| holder.lock(name).unwrap().lock().unwrap())
        .collect();
    let (acquired, acquisitions) = mpsc::channel();
    let waiters: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(n, name)| {
            let (lock, acquired) = (waiting.lock(name).unwrap(), acquired.clone());
            thread::spawn(move || {
                let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
                assert!(guard.is_some(), "{n}: not acquired");
                acquired.send((n, std::time::Instant::now())).unwrap();
            })
        })
        .collect();
    support::eventually(Duration::from_secs(10), "every waiter in BLPOP", || {
        support::parked(&server) == NAMES as u64
    });
    let mut admin = server.connection();
    let tracking: String = redis::cmd("INFO").arg("stats").query(&mut admin).unwrap();
    assert!(tracking.contains("tracking_total_items:0"), "{tracking}");
    for (n, guard) in guards.into_iter().enumerate() {
        let released = std::time::Instant::now();
        guard.unlock().unwrap();
        let (woken, at) = acquisitions.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(woken, n);
        let waited = at.saturating_duration_since(released);
        assert!(
            waited < Duration::from_secs(1),
            "{n} woken after {waited:?}"
        );
    }
    for waiter in waiters {
        waiter.joined();
    }
    let warnings: Vec<String> = LOGS
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains(&format!(":{} refused parking", server.port())))
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}

/// On a Cluster whose ACL refuses `CLUSTER NODES` (the hub's check of the
/// slots its node serves), waiting works as before: one warning for the
/// node, no relinking (the hub's listener stays the same connection), and
/// the waiter wakes at its release.
#[cfg(feature = "cluster")]
#[test]
fn on_a_cluster_a_refused_slot_check_is_one_warning_not_a_relink() {
    record_logs();
    let cluster = testkit::RedisCluster::start(3, 0);
    for master in cluster.masters() {
        add_user(
            master,
            "no-nodes",
            "allcommands allkeys allchannels -cluster|nodes",
        );
    }
    let seeds: Vec<String> = cluster
        .masters()
        .iter()
        .map(|master| user_url(master, "no-nodes", PASSWORD))
        .collect();
    let name = "no-slot-check";
    let node = cluster.master_of_slot(cluster.slot_of(&format!("redbaton:{{{name}}}:lock")));
    let holder = Client::builder(redbaton::Topology::cluster(cluster.seed_urls()))
        .build()
        .unwrap();
    let waiting = Client::builder(redbaton::Topology::cluster(&seeds))
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap();
    let guard = holder.lock(name).unwrap().lock().unwrap();
    let lock = waiting.lock(name).unwrap();
    let waiter = thread::spawn(move || {
        let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
        assert!(guard.is_some(), "not acquired");
        std::time::Instant::now()
    });
    support::eventually(Duration::from_secs(10), "the waiter parks", || {
        support::parked(node) == 1
    });
    let listeners = |admin: &mut redis::Connection| -> Vec<String> {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        list.lines()
            .filter(|line| line.contains(" sub=1 "))
            .filter_map(|line| line.split(' ').next().map(str::to_owned))
            .collect()
    };
    let mut admin = node.connection();
    let before = listeners(&mut admin);
    assert_eq!(before.len(), 1, "{before:?}");
    let warned = || {
        LOGS.0
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains("refused CLUSTER NODES"))
            .count()
    };
    support::eventually(
        Duration::from_secs(5),
        "the refused check's warning",
        || warned() == 1,
    );
    // A refused check that relinked would show a new listener.
    assert_eq!(listeners(&mut admin), before);
    let released = std::time::Instant::now();
    guard.unlock().unwrap();
    let acquired = waiter.joined();
    assert!(
        acquired.saturating_duration_since(released) < Duration::from_secs(1),
        "woken {:?} after the release",
        acquired.saturating_duration_since(released)
    );
    assert_eq!(warned(), 1, "one warning for the node");
}

/// Under the documented ACL (no `PING`), a waiter parked on its client's
/// hub through a long hold costs what it costs without one: the tracker's
/// idle liveness check, refused, still shows the tracker is there, so it
/// is neither dropped and opened again nor are its waiters sent to look
/// again (they were, about once a second).
#[test]
fn a_refused_ping_keeps_the_parking_tracker_and_its_waiters_parked() {
    let server = RedisServer::start();
    add_user(&server, "locker", redbaton_acl());
    let url = user_url(&server, "locker", PASSWORD);
    let (holder, waiting) = (Client::open(&url).unwrap(), Client::open(&url).unwrap());
    let guard = holder.lock("idle").unwrap().lock().unwrap();
    let lock = waiting.lock("idle").unwrap();
    let handle = thread::spawn(move || {
        lock.try_lock_for(Duration::from_secs(20))
            .map(|g| g.map(|g| g.unlock()).is_some())
    });
    let mut admin = server.connection();
    let stats = |admin: &mut redis::Connection| {
        let info: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
        testkit::parse_commandstats(&info)
    };
    support::eventually(Duration::from_secs(5), "the waiter parked", || {
        stats(&mut admin)
            .get("client|tracking")
            .copied()
            .unwrap_or(0)
            >= 1
    });
    let before = stats(&mut admin);
    // A refused command counts as rejected, not as a call.
    let refused_pings = |admin: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
        info.lines()
            .find_map(|line| line.trim().strip_prefix("cmdstat_ping:"))
            .and_then(|fields| {
                fields
                    .split(',')
                    .find_map(|field| field.strip_prefix("rejected_calls="))
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let pings = refused_pings(&mut admin);
    let during = |admin: &mut redis::Connection, command: &str| {
        stats(admin).get(command).copied().unwrap_or(0) - before.get(command).copied().unwrap_or(0)
    };
    // Three of the tracker's idle checks, or a first sign of what they
    // used to bring.
    support::eventually(
        Duration::from_secs(10),
        "three idle checks of the tracker",
        || {
            refused_pings(&mut admin) >= pings + 3
                || during(&mut admin, "client|tracking") > 0
                || during(&mut admin, "evalsha") > 0
        },
    );
    assert_eq!(
        during(&mut admin, "client|tracking"),
        0,
        "the tracker was opened again"
    );
    assert_eq!(during(&mut admin, "evalsha"), 0, "the waiter looked again");
    guard.unlock().unwrap();
    assert!(handle.joined().unwrap());
}

//! Figures for issue 12: what Redis Cluster and replica acknowledgements
//! cost redbaton, each as a ratio to a plain `PING` measured in the same run.
//!
//! 1. On a throwaway 3-master Redis Cluster: the median uncontended cycle
//!    (`lock()` then `unlock()`) of a client built with
//!    `Topology::cluster`, against the median `PING` on a raw connection to
//!    the master that owns the lock's slot (target ≤ 2.2 ×).
//! 2. On the same cluster: the median hand-off between two processes that
//!    take turns on one lock, from the holder's release to the other
//!    process's acquisition, against the same `PING` (target ≤ 4 ×). The
//!    release time is read just before `unlock()`, the acquisition time
//!    just after `lock()` returns, both on the wall clock.
//! 3. On a throwaway master with one replica: the median uncontended cycle
//!    with and without `replica_acks(1, 500 ms)`, against `PING` on the
//!    master.
//!
//! ```text
//! cargo bench --bench cluster --features cluster
//! ```
//!
//! Needs `redis-server` on PATH. The bench runs itself again as child
//! processes (`--child handoff ...`) for the cross-process hand-off. Absolute
//! times are noisy on a shared machine; the ratios are what to compare.

use std::env;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redbaton::{Client, Topology};
use testkit::{RedisCluster, RedisServer};

/// Cycles run and thrown away before any timing.
const WARM_UP: usize = 300;
/// Timed cycles per median.
const ROUNDS: usize = 2_000;
/// Acquisitions per process in the hand-off run.
const HANDOFF_TURNS: usize = 600;
/// Hand-offs at the start of the run left out (connections, scripts).
const HANDOFF_SKIP: usize = 50;
/// How long a holder keeps the lock in the hand-off run: long enough that
/// the other process is surely parked when it lets go.
const HANDOFF_HOLD: Duration = Duration::from_millis(3);
/// How long a process waits after its release before asking again, so the
/// waiting process gets the lock and the two alternate.
const HANDOFF_PAUSE: Duration = Duration::from_millis(1);
/// The lock of the cross-process run.
const HANDOFF_LOCK: &str = "bench:cluster:handoff";

/// Nanoseconds on the wall clock (CLOCK_REALTIME): comparable between the
/// processes of one machine.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The key of lock `name` under the default prefix.
fn lock_key(name: &str) -> String {
    format!("redbaton:{{{name}}}:lock")
}

/// The median duration of one call of `f`, after `WARM_UP` untimed calls.
fn median(mut f: impl FnMut()) -> Duration {
    for _ in 0..WARM_UP {
        f();
    }
    let mut times: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[ROUNDS / 2]
}

fn ping_median(conn: &mut redis::Connection) -> Duration {
    median(|| {
        redis::cmd("PING")
            .query::<String>(conn)
            .map(drop)
            .expect("PING")
    })
}

fn cycle_median(client: &Client, name: &str) -> Duration {
    let lock = client.lock(name).expect("lock name");
    median(|| lock.lock().expect("lock").unlock().expect("unlock"))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ratio(d: Duration, ping: Duration) -> f64 {
    d.as_secs_f64() / ping.as_secs_f64()
}

fn verdict(ratio: f64, target: f64) -> &'static str {
    if ratio <= target {
        "met"
    } else {
        "not met"
    }
}

/// One acquisition in the hand-off run, as a child prints it.
#[derive(Clone, Copy, Debug)]
struct Turn {
    process: u64,
    asked: u64,
    got: u64,
    released: u64,
}

/// A child process: takes `HANDOFF_LOCK` `HANDOFF_TURNS` times from
/// `start_at` (wall-clock ns) on, printing one line per turn.
fn run_handoff_child(tag: u64, start_at: u64, seeds: &[String]) {
    let client = Client::builder(Topology::cluster(seeds))
        .build()
        .expect("cluster client");
    let lock = client.lock(HANDOFF_LOCK).expect("lock name");
    // Connects and loads the scripts before the start.
    for _ in 0..20 {
        lock.lock().expect("lock").unlock().expect("unlock");
    }
    thread::sleep(Duration::from_nanos(start_at.saturating_sub(now_ns())));
    for _ in 0..HANDOFF_TURNS {
        let asked = now_ns();
        let guard = lock.lock().expect("lock");
        let got = now_ns();
        thread::sleep(HANDOFF_HOLD);
        let released = now_ns();
        guard.unlock().expect("unlock");
        println!("{tag} {asked} {got} {released}");
        thread::sleep(HANDOFF_PAUSE);
    }
}

/// This bench binary again, as a child process.
fn child(args: &[String]) -> Child {
    Command::new(env::current_exe().expect("current exe"))
        .arg("--child")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child")
}

/// What the cross-process run showed.
struct Handoffs {
    median: Duration,
    p99: Duration,
    count: usize,
    /// Turns that followed one of the same process (no hand-off).
    same_again: usize,
    overlaps: usize,
}

fn cross_process_handoff(seeds: &[String]) -> Handoffs {
    let start_at = now_ns() + Duration::from_millis(1_500).as_nanos() as u64;
    let mut children: Vec<Child> = (1..=2u64)
        .map(|tag| {
            let mut args = vec!["handoff".to_owned(), tag.to_string(), start_at.to_string()];
            args.extend(seeds.iter().cloned());
            child(&args)
        })
        .collect();
    let mut turns = Vec::new();
    for c in &mut children {
        let out = BufReader::new(c.stdout.take().expect("child stdout"));
        for line in out.lines().map_while(Result::ok) {
            let n: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [process, asked, got, released] = n[..] {
                turns.push(Turn {
                    process,
                    asked,
                    got,
                    released,
                });
            }
        }
        let status = c.wait().expect("reap child");
        assert!(status.success(), "hand-off child failed: {status}");
    }
    turns.sort_by_key(|t| t.got);
    let (mut handoffs, mut same_again, mut overlaps) = (Vec::new(), 0, 0);
    for pair in turns.windows(2).skip(HANDOFF_SKIP) {
        let (a, b) = (pair[0], pair[1]);
        if b.got < a.released {
            overlaps += 1;
        }
        if a.process == b.process {
            same_again += 1;
        } else if b.asked < a.released {
            // The other process was already waiting when this one let go.
            handoffs.push(b.got.saturating_sub(a.released));
        }
    }
    handoffs.sort_unstable();
    let at = |q: f64| {
        let i = ((handoffs.len().saturating_sub(1)) as f64 * q) as usize;
        Duration::from_nanos(handoffs.get(i).copied().unwrap_or(0))
    };
    Handoffs {
        median: at(0.5),
        p99: at(0.99),
        count: handoffs.len(),
        same_again,
        overlaps,
    }
}

fn info_replication(server: &RedisServer) -> String {
    redis::cmd("INFO")
        .arg("replication")
        .query(&mut server.connection())
        .unwrap_or_default()
}

/// Waits until `replica` is connected to `master` and in sync.
fn wait_for_replica(master: &RedisServer, replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(info_replication(master).contains("connected_slaves:1")
        && info_replication(replica).contains("master_link_status:up"))
    {
        assert!(
            Instant::now() < deadline,
            "the replica did not come up within 20 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn cluster_figures() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seed_urls();
    println!(
        "3-master Redis Cluster up in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let name = "bench:cluster:uncontended";
    let slot = cluster.slot_of(&lock_key(name));
    let owner = cluster.master_of_slot(slot);
    let ping = ping_median(&mut owner.connection());
    let client = Client::builder(Topology::cluster(&seeds))
        .build()
        .expect("cluster client");
    let cycle = cycle_median(&client, name);
    let x = ratio(cycle, ping);
    println!(
        "cluster PING (master of slot {slot} of lock {name:?}, port {}): {:.1} µs",
        owner.port(),
        us(ping)
    );
    println!(
        "cluster uncontended cycle: {:.1} µs = {:.2} × PING ({:.1} µs) — target ≤ 2.2 ×: {}",
        us(cycle),
        x,
        us(ping),
        verdict(x, 2.2)
    );

    let handoff_slot = cluster.slot_of(&lock_key(HANDOFF_LOCK));
    let handoff_owner = cluster.master_of_slot(handoff_slot);
    let handoff_ping = ping_median(&mut handoff_owner.connection());
    let h = cross_process_handoff(&seeds);
    let x = ratio(h.median, handoff_ping);
    println!(
        "cluster cross-process hand-off: {:.1} µs = {:.2} × PING ({:.1} µs, master of slot {handoff_slot}) — target ≤ 4 ×: {}  [p99 {:.1} µs; {} hand-offs, {} same-process repeats, {} overlaps]",
        us(h.median),
        x,
        us(handoff_ping),
        verdict(x, 4.0),
        us(h.p99),
        h.count,
        h.same_again,
        h.overlaps
    );
}

fn replica_ack_figures() {
    let master = RedisServer::start();
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_for_replica(&master, &replica);

    let ping = ping_median(&mut master.connection());
    let plain = Client::builder(master.url()).build().expect("client");
    let acked = Client::builder(master.url())
        .replica_acks(1, Duration::from_millis(500))
        .build()
        .expect("client with replica acks");
    let without = cycle_median(&plain, "bench:acks:without");
    let with = cycle_median(&acked, "bench:acks:with");
    println!("master + 1 replica, PING on the master: {:.1} µs", us(ping));
    println!(
        "uncontended cycle without replica_acks: {:.1} µs = {:.2} × PING",
        us(without),
        ratio(without, ping)
    );
    println!(
        "uncontended cycle with replica_acks(1, 500 ms): {:.1} µs = {:.2} × PING",
        us(with),
        ratio(with, ping)
    );
    println!(
        "replica_acks(1, 500 ms) costs {:+.1} µs = {:+.2} × PING per acquisition",
        us(with) - us(without),
        ratio(with, ping) - ratio(without, ping)
    );
}

fn main() {
    let args: Vec<String> = env::args().skip_while(|a| a != "--child").skip(1).collect();
    if let [role, tag, start_at, seeds @ ..] = &args[..] {
        assert_eq!(role, "handoff", "unknown child role {role}");
        let tag = tag.parse().expect("tag");
        let start_at = start_at.parse().expect("start time");
        return run_handoff_child(tag, start_at, seeds);
    }
    println!(
        "redbaton cluster benchmarks (issue 12); medians of {ROUNDS} rounds after {WARM_UP} warm-up\n"
    );
    cluster_figures();
    println!();
    replica_ack_figures();
}

//! Redis Cluster, a slot on the move: what a waiter costs and gets while
//! its lock's slot migrates between two masters (IMPORTING/MIGRATING set,
//! then the keys moved with `MIGRATE`, then `SETSLOT NODE`), how plain
//! calls follow `ASK` and `MOVED`, and a parked waiter whose master dies.

use std::collections::BTreeMap;
use std::fmt;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, ClientBuilder, Topology};
use testkit::{RedisCluster, RedisServer, SlotMigration};

use crate::support::{self, baton_key, eventually, lock_key, wait_for_replica, JoinWithin};

/// A client of `cluster`, configured by `configure`.
fn client(
    cluster: &RedisCluster,
    configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> Client {
    configure(Client::builder(Topology::cluster(cluster.seed_urls())))
        .build()
        .unwrap()
}

/// Waiters parked on `node`: in its parking hub (a name registered for an
/// announcement) or, after `ASK`, in `BLPOP` (see [`support::parked`]).
fn parked_on(node: &RedisServer) -> u64 {
    support::parked(node)
}

/// What the masters of a cluster were sent between two readings: the
/// commands a client sends (run, or refused with a redirection: `calls` +
/// `rejected_calls` of `INFO commandstats`; not those its scripts run) and
/// connections accepted. Reads over connections of its own, opened once,
/// so that reading costs no connection.
struct Meter {
    conns: Vec<redis::Connection>,
}

/// What a waiting or releasing client sends: scripts, parks, redirections
/// followed, slot maps asked for, the park timer's commands.
const SENT: &[&str] = &[
    "evalsha",
    "eval",
    "script|load",
    "blpop",
    "asking",
    "cluster|slots",
    "client|id",
    "client|unblock",
];

#[derive(Debug, Default)]
struct Cost {
    commands: BTreeMap<String, u64>,
    connections: u64,
}

impl Meter {
    fn new(cluster: &RedisCluster) -> Meter {
        Meter {
            conns: cluster.masters().iter().map(|m| m.connection()).collect(),
        }
    }

    fn read(&mut self) -> Cost {
        let mut cost = Cost::default();
        for conn in &mut self.conns {
            let stats: String = redis::cmd("INFO").arg("stats").query(conn).unwrap();
            cost.connections += field(&stats, "total_connections_received");
            let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
            for line in info.lines() {
                let Some((name, fields)) = line
                    .trim()
                    .strip_prefix("cmdstat_")
                    .and_then(|l| l.split_once(':'))
                else {
                    continue;
                };
                if !SENT.contains(&name) {
                    continue;
                }
                let fields = fields.replace(',', "\n");
                let sent = field(&fields, "calls") + field(&fields, "rejected_calls");
                *cost.commands.entry(name.to_owned()).or_default() += sent;
            }
        }
        cost
    }
}

/// The number after `name=` or `name:` on a line of `text`.
fn field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix(name)?
                .strip_prefix([':', '='])?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

impl Cost {
    fn since(self, before: &Cost) -> Cost {
        let commands = self
            .commands
            .into_iter()
            .filter(|(name, _)| name != "info")
            .filter_map(|(name, n)| {
                let new = n - before.commands.get(&name).copied().unwrap_or(0);
                (new > 0).then_some((name, new))
            })
            .collect();
        Cost {
            commands,
            connections: self.connections - before.connections,
        }
    }

    fn total(&self) -> u64 {
        self.commands.values().sum()
    }

    fn of(&self, command: &str) -> u64 {
        self.commands.get(command).copied().unwrap_or(0)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} commands {:?}, {} new connections",
            self.total(),
            self.commands,
            self.connections
        )
    }
}

#[test]
fn a_waiter_parks_on_the_importing_node_while_its_slot_migrates() {
    let cluster = RedisCluster::start(2, 0);
    let name = "moving";
    let migration = SlotMigration::of(&cluster, &lock_key(name));
    let holder = client(&cluster, |b| b);
    // A fixed lease: the holder's client sends nothing while we count.
    let guard = holder
        .lock(name)
        .unwrap()
        .with_fixed_lease(Duration::from_secs(60))
        .unwrap()
        .lock()
        .unwrap();
    // A long maximum park: a waiter that comes back before it was woken
    // (or its deadline) is not parked.
    let waiter = client(&cluster, |b| b.max_park(Duration::from_secs(10)));
    let lock = waiter.lock(name).unwrap();
    // The identity, the scripts and the slot map, loaded once.
    assert!(lock.try_lock().unwrap().is_none());
    let mut meter = Meter::new(&cluster);
    let wait = Duration::from_secs(2);

    let before = meter.read();
    assert!(lock.try_lock_for(wait).unwrap().is_none());
    let normal = meter.read().since(&before);

    migration.begin();
    let before = meter.read();
    let started = Instant::now();
    let waited = lock.try_lock_for(wait);
    let took = started.elapsed();
    let migrating = meter.read().since(&before);
    println!(
        "a waiter's {wait:?} on a held lock: normally {normal}; while its slot migrates \
         {migrating}"
    );
    // Not a wrong topology, nor any error: the deadline passed while held.
    assert!(matches!(waited, Ok(None)), "{waited:?}");
    assert!(took < wait + Duration::from_millis(500), "{took:?}");
    assert_eq!(
        migrating.of("cluster|slots"),
        0,
        "ASK is no change of the slot map: {migrating}"
    );
    assert!(
        migrating.total() <= 2 * normal.total(),
        "within twice the normal cost: {migrating} against {normal}"
    );
    // A parking and a command connection on the importing node.
    assert!(
        migrating.connections <= 2 * normal.connections.max(1),
        "{migrating}"
    );

    // The holder releases mid-migration. Redis refuses a script whose keys
    // are not all on one node (TRYAGAIN: the baton list is on neither) until
    // the slot is stable, so the release goes on in the background; the
    // waiter, parked on the importing node, has the lock as soon as the
    // release lands there.
    let waiting = thread::spawn(move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("acquired after the release");
        let at = Instant::now();
        guard.unlock().unwrap();
        at
    });
    eventually(
        Duration::from_secs(5),
        "the waiter parks on the importing node",
        || parked_on(migration.to) == 1,
    );
    let before = meter.read();
    if let Err(err) = guard.unlock() {
        assert!(err.is_transient(), "a migration is not now, not no: {err}");
    }
    // Time for the background release to be refused a few times.
    thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "acquired while the holder had it");
    assert!(migration.move_keys() > 0, "the lock has keys to move");
    migration.finish();
    let finished = Instant::now();
    let acquired = waiting.joined();
    let released = meter.read().since(&before);
    println!(
        "acquired {:?} after the migration ended; release and wait cost {released}",
        acquired.saturating_duration_since(finished)
    );
    assert!(
        acquired.saturating_duration_since(finished) < Duration::from_secs(2),
        "the baton woke the waiter (it parks for 10 s): {:?}",
        acquired.saturating_duration_since(finished)
    );
    // One change of the map, seen by each client once.
    assert!(released.of("cluster|slots") <= 2, "{released}");
}

#[test]
fn a_migration_half_undone_costs_a_waiter_a_few_commands_per_park() {
    let cluster = RedisCluster::start(2, 0);
    let name = "half-undone";
    let migration = SlotMigration::of(&cluster, &lock_key(name));
    let holder = client(&cluster, |b| b);
    let _guard = holder
        .lock(name)
        .unwrap()
        .with_fixed_lease(Duration::from_secs(60))
        .unwrap()
        .lock()
        .unwrap();
    let waiter = client(&cluster, |b| b.max_park(Duration::from_secs(10)));
    let lock = waiter.lock(name).unwrap();
    assert!(lock.try_lock().unwrap().is_none());
    // The target no longer imports (`SETSLOT STABLE` reached it first):
    // the source sends the waiter's park there with ASK, and the target
    // sends it back with MOVED.
    migration.begin();
    migration.set_slot(migration.to, &["STABLE"]);
    let mut meter = Meter::new(&cluster);
    let before = meter.read();
    let waited = lock.try_lock_for(Duration::from_secs(2));
    let cost = meter.read().since(&before);
    println!("a waiter's 2 s sent back and forth: {cost}");
    assert!(matches!(waited, Ok(None)), "{waited:?}");
    // One park of the two seconds: its redirections, one reload.
    assert!(cost.total() <= 20, "{cost}");
    assert!(cost.of("cluster|slots") <= 1, "{cost}");
}

#[test]
fn a_waiter_parked_during_a_migration_wakes_at_a_release_after_it() {
    let cluster = RedisCluster::start(2, 0);
    let name = "moved";
    let migration = SlotMigration::of(&cluster, &lock_key(name));
    let holder = client(&cluster, |b| b);
    let guard = holder
        .lock(name)
        .unwrap()
        .with_fixed_lease(Duration::from_secs(60))
        .unwrap()
        .lock()
        .unwrap();
    migration.begin();
    let waiter = client(&cluster, |b| b.max_park(Duration::from_secs(10)));
    let lock = waiter.lock(name).unwrap();
    let waiting = thread::spawn(move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("acquired after the release");
        let at = Instant::now();
        guard.unlock().unwrap();
        at
    });
    eventually(
        Duration::from_secs(5),
        "the waiter parks on the importing node",
        || parked_on(migration.to) == 1,
    );
    assert!(migration.move_keys() > 0, "the lock has keys to move");
    migration.finish();
    // The park outlives the migration: the slot's new owner is where it
    // waits.
    assert_eq!(parked_on(migration.to), 1);
    let released = Instant::now();
    guard
        .unlock()
        .expect("released in one call on the new owner");
    let acquired = waiting.joined();
    assert!(
        acquired.duration_since(released) < Duration::from_secs(1),
        "the baton woke the waiter (it parks for 10 s): {:?}",
        acquired.duration_since(released)
    );
}

#[test]
fn ask_is_followed_with_asking_to_a_lock_that_has_moved() {
    let cluster = RedisCluster::start(2, 0);
    let name = "asked";
    let migration = SlotMigration::of(&cluster, &lock_key(name));
    let client = client(&cluster, |b| b);
    let lock = client.lock(name).unwrap();
    let guard = lock.lock().unwrap();
    // A baton list left by an earlier release: a release needs every key
    // it names on one node, or Redis refuses it (TRYAGAIN) until the slot
    // is stable.
    redis::pipe()
        .cmd("RPUSH")
        .arg(baton_key(name))
        .arg("ok")
        .cmd("PEXPIRE")
        .arg(baton_key(name))
        .arg(60_000)
        .query::<()>(&mut migration.from.connection())
        .unwrap();
    migration.begin();
    assert!(migration.move_keys() > 0, "the lock has keys to move");
    let mut meter = Meter::new(&cluster);
    let before = meter.read();

    // The client's map still says the source, which answers ASK.
    let holder = lock.holder().expect("holder() in one call").expect("held");
    assert_eq!(holder.fencing_token, guard.fencing_token());
    guard.unlock().expect("unlock() in one call");
    let (exists,): (bool,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(lock_key(name))
        .query(&mut migration.to.connection())
        .unwrap();
    assert!(!exists, "released on the importing node");
    let cost = meter.read().since(&before);
    println!("holder() and unlock() during the migration: {cost}");
    // `NOSCRIPT` on the importing node: each command of the exchange is
    // asked (`ASKING` holds for one).
    assert!(cost.of("asking") >= 2, "{cost}");
    assert_eq!(
        cost.of("cluster|slots"),
        0,
        "ASK is no change of the map: {cost}"
    );
}

#[test]
fn ask_is_followed_to_a_new_master_the_slot_map_does_not_list_yet() {
    let cluster = RedisCluster::start(2, 0);
    // A master joining the cluster, with no slot yet: absent from
    // `CLUSTER SLOTS` until its first slot has moved.
    let joining =
        RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"]);
    redis::cmd("CLUSTER")
        .arg("MEET")
        .arg("127.0.0.1")
        .arg(cluster.masters()[0].port())
        .query::<()>(&mut joining.connection())
        .unwrap();
    let joining_id = RedisCluster::node_id(&joining);
    eventually(
        Duration::from_secs(10),
        "every master knows the new one",
        || {
            cluster.masters().iter().chain([&joining]).all(|node| {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut node.connection())
                    .unwrap();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap();
                nodes.contains(&joining_id)
                    && nodes.lines().count() == 3
                    && !nodes.contains("handshake")
                    && info.contains("cluster_state:ok")
            })
        },
    );
    let name = "joining";
    let migration = SlotMigration::to(&cluster, &lock_key(name), &joining);
    let client = client(&cluster, |b| b);
    let lock = client.lock(name).unwrap();
    let guard = lock.lock().unwrap();
    redis::pipe()
        .cmd("RPUSH")
        .arg(baton_key(name))
        .arg("ok")
        .cmd("PEXPIRE")
        .arg(baton_key(name))
        .arg(60_000)
        .query::<()>(&mut migration.from.connection())
        .unwrap();
    migration.begin();
    assert!(migration.move_keys() > 0, "the lock has keys to move");

    let holder = lock.holder().expect("holder() in one call").expect("held");
    assert_eq!(holder.fencing_token, guard.fencing_token());
    guard.unlock().expect("unlock() in one call");
    assert!(!lock.is_locked().unwrap());
    migration.finish();
    // Once the map lists it, the new master serves the lock as any other.
    lock.try_lock().unwrap().expect("free").unlock().unwrap();
}

#[test]
fn a_renewed_holder_reloads_the_map_once_for_a_migration() {
    let cluster = RedisCluster::start(2, 0);
    let name = "renewed";
    let migration = SlotMigration::of(&cluster, &lock_key(name));
    // Renewed every 300 ms.
    let holder = client(&cluster, |b| b.default_lease(Duration::from_millis(900)));
    let guard = holder.lock(name).unwrap().lock().unwrap();
    let mut meter = Meter::new(&cluster);
    let before = meter.read();
    migration.begin();
    assert!(migration.move_keys() > 0, "the lock has keys to move");
    // Renewals answered ASK by the source, for a few rounds.
    thread::sleep(Duration::from_millis(1500));
    assert!(!guard.is_lost(), "renewed on the importing node");
    let asked = meter.read().since(&before);
    migration.finish();
    thread::sleep(Duration::from_millis(1500));
    assert!(!guard.is_lost(), "renewed on the new owner");
    let cost = meter.read().since(&before);
    println!("a renewed holder through a migration: while asked {asked}; in all {cost}");
    assert!(asked.of("asking") > 0, "renewals were asked: {asked}");
    assert_eq!(
        asked.of("cluster|slots"),
        0,
        "ASK is no change of the map: {asked}"
    );
    assert_eq!(cost.of("cluster|slots"), 1, "MOVED is one: {cost}");
    guard.unlock().unwrap();
}

#[test]
fn moved_reloads_the_slot_map_once() {
    let cluster = RedisCluster::start(2, 0);
    let name = "relocated";
    let migration = SlotMigration::of(&cluster, &lock_key(name));
    let client = client(&cluster, |b| b);
    let lock = client.lock(name).unwrap();
    // The map is loaded before the slot moves.
    lock.try_lock().unwrap().expect("free").unlock().unwrap();
    migration.begin();
    assert!(migration.move_keys() > 0, "the lock has keys to move");
    migration.finish();

    let mut meter = Meter::new(&cluster);
    let before = meter.read();
    let guard = lock
        .try_lock()
        .expect("no run of redirections")
        .expect("free");
    guard.unlock().unwrap();
    let first = meter.read().since(&before);
    let source = migration.from.command_calls();
    lock.try_lock().unwrap().expect("free").unlock().unwrap();
    println!("the first call after the move: {first}");
    assert_eq!(first.of("cluster|slots"), 1, "one reload: {first}");
    assert_eq!(
        migration.from.commands_since(&source),
        BTreeMap::new(),
        "after the reload, nothing goes to the old owner"
    );
}

#[test]
fn a_parked_waiter_acquires_on_the_promoted_replica_within_the_failover_and_an_io_timeout() {
    let cluster = RedisCluster::start(3, 1);
    let io_timeout = Duration::from_secs(1);
    let name = "promoted";
    let slot = cluster.slot_of(&lock_key(name));
    let index = usize::from(slot) * 3 / usize::from(testkit::SLOTS);
    let master = &cluster.masters()[index];
    let replica = &cluster.replicas_of(index)[0];

    // A holder whose fixed lease ends before the failover can: the lock
    // is free on the promoted replica.
    let holder = client(&cluster, |b| b.io_timeout(io_timeout));
    std::mem::forget(
        holder
            .lock(name)
            .unwrap()
            .with_fixed_lease(Duration::from_millis(1500))
            .unwrap()
            .lock()
            .unwrap(),
    );
    wait_for_replica(master, &format!("redbaton:{{{name}}}:test-sync"));
    let waiter = client(&cluster, |b| {
        b.io_timeout(io_timeout).max_park(Duration::from_secs(10))
    });
    let lock = waiter.lock(name).unwrap();
    let waiting = thread::spawn(move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("acquired on the promoted replica");
        let at = Instant::now();
        guard.unlock().unwrap();
        at
    });
    eventually(Duration::from_secs(5), "the waiter parks", || {
        parked_on(master) == 1
    });
    let killed = Instant::now();
    master.kill();
    let mut conn = replica.connection();
    let promoted = loop {
        let role: redis::Value = redis::cmd("ROLE").query(&mut conn).unwrap();
        if format!("{role:?}").contains("master") {
            break Instant::now();
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "no failover");
        thread::sleep(Duration::from_millis(5));
    };
    let acquired = waiting.joined();
    println!(
        "failover took {:?}; the waiter acquired {:?} after it",
        promoted - killed,
        acquired.saturating_duration_since(promoted)
    );
    assert!(
        acquired.saturating_duration_since(promoted) < io_timeout,
        "within the failover and less than one io_timeout: {:?} after the promotion",
        acquired.saturating_duration_since(promoted)
    );
}

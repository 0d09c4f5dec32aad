//! Redis Cluster only: processes on names spread over every master, a
//! slot migrated under a holder and a parked waiter, a master failed over
//! under parked waiters, one socket per parked waiter, and the errors of a
//! deployment that is not what the client was built for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error, Topology};
use testkit::{RedisCluster, RedisServer, SlotMigration};

use crate::support::{
    self, eventually, lock_key, spawn_child_at, wait_for_replica, Deployment, JoinWithin,
    Topology as Kind,
};

/// Names of the cross-process test; the test checks they cover every
/// master of a three-master cluster.
const SPREAD: &[&str] = &["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
const THREADS_PER_CHILD: usize = 4;
const ROUNDS_PER_THREAD: usize = 30;

pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "cluster_increment" => increment_worker(url),
        _ => return false,
    }
    true
}

/// A connection to the node that serves `key`, found by following the
/// `MOVED` of the first seed.
fn raw_for(seeds: &[&str], key: &str) -> redis::Connection {
    let mut conn = redis::Client::open(seeds[0])
        .unwrap()
        .get_connection()
        .unwrap();
    match redis::cmd("EXISTS").arg(key).query::<bool>(&mut conn) {
        Ok(_) => conn,
        Err(err) => {
            let (addr, _) = err.redirect_node().expect("a MOVED reply");
            redis::Client::open(format!("redis://{addr}/"))
                .unwrap()
                .get_connection()
                .unwrap()
        }
    }
}

/// Threads doing a non-atomic read-modify-write of a counter beside each
/// lock (same slot), marking occupancy; prints the overlaps seen.
fn increment_worker(url: &str) {
    let seeds: Vec<&str> = url.split(',').collect();
    let client = Client::builder(Topology::cluster(&seeds)).build().unwrap();
    println!("READY");
    thread::sleep(Duration::from_millis(200));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS_PER_CHILD)
        .map(|t| {
            let client = client.clone();
            let seeds: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
            let overlaps = Arc::clone(&overlaps);
            thread::spawn(move || {
                let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                let mut raws: HashMap<&str, redis::Connection> = HashMap::new();
                for round in 0..ROUNDS_PER_THREAD {
                    let name = SPREAD[(t + round) % SPREAD.len()];
                    let counter = format!("redbaton:{{{name}}}:test-counter");
                    let occupant = format!("redbaton:{{{name}}}:test-occupant");
                    let raw = raws
                        .entry(name)
                        .or_insert_with(|| raw_for(&seeds, &counter));
                    let guard = client
                        .lock(name)
                        .unwrap()
                        .try_lock_for(Duration::from_secs(60))
                        .unwrap()
                        .expect("acquired within a minute");
                    let entered: bool = redis::cmd("SET")
                        .arg(&occupant)
                        .arg(1)
                        .arg("NX")
                        .query::<Option<String>>(raw)
                        .unwrap()
                        .is_some();
                    if !entered {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let count: u64 = redis::cmd("GET")
                        .arg(&counter)
                        .query::<Option<u64>>(raw)
                        .unwrap()
                        .unwrap_or(0);
                    redis::cmd("SET")
                        .arg(&counter)
                        .arg(count + 1)
                        .query::<()>(raw)
                        .unwrap();
                    redis::cmd("DEL").arg(&occupant).query::<()>(raw).unwrap();
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.joined();
    }
    println!("RESULT {}", overlaps.load(Ordering::SeqCst));
}

#[test]
fn two_processes_never_overlap_on_names_spread_over_every_master() {
    let deployment = Deployment::start(Kind::Cluster);
    let cluster = deployment.cluster();
    let masters: std::collections::BTreeSet<u16> = SPREAD
        .iter()
        .map(|name| {
            cluster
                .master_of_slot(cluster.slot_of(&lock_key(name)))
                .port()
        })
        .collect();
    assert_eq!(masters.len(), 3, "the names cover every master");

    let seeds = cluster.seed_urls().join(",");
    let mut children = [
        spawn_child_at("cluster_increment", seeds.clone()),
        spawn_child_at("cluster_increment", seeds),
    ];
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    for child in &mut children {
        let result = child.wait_for_line("RESULT", Duration::from_secs(120));
        assert_eq!(result.trim(), "0", "a child saw another holder inside");
    }
    let mut total = 0;
    for name in SPREAD {
        let counter = format!("redbaton:{{{name}}}:test-counter");
        let node = cluster.master_of_slot(cluster.slot_of(&counter));
        let count: u64 = redis::cmd("GET")
            .arg(&counter)
            .query(&mut node.connection())
            .unwrap();
        total += count;
    }
    assert_eq!(
        total as usize,
        2 * THREADS_PER_CHILD * ROUNDS_PER_THREAD,
        "no update lost"
    );
}

/// Moves the slot the way `redis-cli --cluster reshard` does, pausing
/// between the steps so that commands meet `ASK` and `TRYAGAIN` states
/// too.
fn migrate_slot(migration: &SlotMigration<'_>) {
    migration.begin();
    thread::sleep(Duration::from_millis(300));
    migration.move_keys();
    thread::sleep(Duration::from_millis(300));
    migration.finish();
}

#[test]
fn a_holder_and_a_parked_waiter_follow_their_slot_to_another_master() {
    let deployment = Deployment::start(Kind::Cluster);
    let cluster = deployment.cluster();
    let name = "migrating";
    let migration = SlotMigration::of(cluster, &lock_key(name));
    let (from, to) = (migration.from, migration.to);

    // A short lease: the holder must renew on the new master to keep it.
    let holder_client = deployment
        .builder()
        .default_lease(Duration::from_millis(900))
        .build()
        .unwrap();
    let guard = holder_client.lock(name).unwrap().lock().unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let lock = deployment.client().lock(name).unwrap();
        let released = Arc::clone(&released);
        thread::spawn(move || {
            let guard = lock
                .try_lock_for(Duration::from_secs(30))
                .unwrap()
                .expect("acquired after the release");
            assert!(
                released.load(Ordering::SeqCst),
                "the waiter got the lock while its holder still had it"
            );
            let at = Instant::now();
            guard.unlock().unwrap();
            at
        })
    };
    eventually(Duration::from_secs(10), "the waiter parks", || {
        support::parked(from) == 1
    });
    migrate_slot(&migration);
    let exists: bool = redis::cmd("EXISTS")
        .arg(lock_key(name))
        .query(&mut to.connection())
        .unwrap();
    assert!(exists, "the lock moved with its slot");
    // Several leases on the new master: only renewals there keep it.
    thread::sleep(Duration::from_millis(2500));
    assert!(
        !guard.is_lost(),
        "the holder kept renewing on the new master"
    );
    released.store(true, Ordering::SeqCst);
    let release = Instant::now();
    guard.unlock().unwrap();
    let acquired = waiter.joined();
    assert!(
        acquired.duration_since(release) < Duration::from_secs(3),
        "the waiter moved on to the new master: {:?} after the release",
        acquired.duration_since(release)
    );
}

#[test]
fn waiters_move_on_and_acquire_after_their_master_fails_over() {
    let cluster = RedisCluster::start(3, 1);
    let seeds = cluster.seed_urls();
    let client = || {
        Client::builder(Topology::cluster(&seeds))
            .io_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let name = "failover";
    let slot = cluster.slot_of(&lock_key(name));
    let master = cluster.master_of_slot(slot);

    // A holder that never releases: its fixed lease must end.
    let holder = client();
    let lease = Duration::from_secs(2);
    std::mem::forget(
        holder
            .lock(name)
            .unwrap()
            .with_fixed_lease(lease)
            .unwrap()
            .lock()
            .unwrap(),
    );
    // The replica has the lock before its master dies (a key in the
    // lock's slot: the master serves it).
    wait_for_replica(master, &format!("redbaton:{{{name}}}:test-sync"));

    let inside = Arc::new(AtomicUsize::new(0));
    let waiters_client = client();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let lock = waiters_client.lock(name).unwrap();
            let inside = Arc::clone(&inside);
            thread::spawn(move || {
                let guard = lock
                    .try_lock_for(Duration::from_secs(40))
                    .unwrap()
                    .expect("acquired after the failover");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                thread::sleep(Duration::from_millis(20));
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().unwrap();
            })
        })
        .collect();
    // One of the three parks in Redis for them all.
    eventually(Duration::from_secs(10), "the waiters park", || {
        support::parked(master) == 1
    });
    let killed = Instant::now();
    master.kill();
    for waiter in waiters {
        waiter.joined();
    }
    let promoted = &cluster.replicas_of(
        cluster
            .masters()
            .iter()
            .position(|m| m.port() == master.port())
            .unwrap(),
    )[0];
    let role: redis::Value = redis::cmd("ROLE")
        .query(&mut promoted.connection())
        .unwrap();
    assert!(
        format!("{role:?}").contains("master"),
        "the replica was promoted: {role:?}"
    );
    println!(
        "three waiters acquired {:?} after the master was killed",
        killed.elapsed()
    );
}

/// A waiter parks in the hub of the node that serves its lock: the hub's
/// two connections there (beside the attempt's), no blocked call, and
/// nothing on the other masters.
#[test]
fn a_parked_waiter_parks_on_its_node_only() {
    let deployment = Deployment::start(Kind::Cluster);
    let cluster = deployment.cluster();
    let name = "one-socket";
    let owner = cluster.master_of_slot(cluster.slot_of(&lock_key(name)));
    let clients_on = |node: &RedisServer| -> Vec<String> {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut node.connection())
            .unwrap();
        // Not the connection asking.
        list.lines()
            .filter(|line| !line.contains("cmd=client|list"))
            .map(str::to_owned)
            .collect()
    };
    let holder = deployment.client();
    let guard = holder.lock(name).unwrap().lock().unwrap();
    let before: Vec<usize> = cluster
        .masters()
        .iter()
        .map(|m| clients_on(m).len())
        .collect();

    let waiter = deployment
        .builder()
        .max_park(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = waiter.lock(name).unwrap();
    let parked =
        thread::spawn(move || lock.try_lock_for(Duration::from_secs(5)).unwrap().is_none());
    eventually(Duration::from_secs(5), "the waiter parks", || {
        support::parked(owner) == 1
    });
    thread::sleep(Duration::from_millis(300));
    for (master, before) in cluster.masters().iter().zip(&before) {
        let now = clients_on(master);
        let blpops = now.iter().filter(|c| c.contains("cmd=blpop")).count();
        // Parked in the node's hub, not in a blocked call.
        assert_eq!(blpops, 0);
        if master.port() == owner.port() {
            assert_eq!(support::parked(master), 1, "one name parked on its master");
            // The hub's listener and tracker, and the connection that made
            // the attempt.
            assert!(
                now.len() <= before + 3,
                "{} connections: {now:#?}",
                now.len()
            );
        } else {
            assert_eq!(support::parked(master), 0);
            assert_eq!(
                now.len(),
                *before,
                "no socket on the other masters: {now:#?}"
            );
        }
    }
    assert!(parked.joined(), "timed out while held");
    drop(guard);
}

#[test]
fn a_cluster_node_given_as_one_server_is_a_clear_error() {
    let deployment = Deployment::start(Kind::Cluster);
    let cluster = deployment.cluster();
    let seed = &cluster.masters()[0];
    let client = support::client(seed);
    // A name whose slot another master serves.
    let name = SPREAD
        .iter()
        .find(|n| cluster.master_of_slot(cluster.slot_of(&lock_key(n))).port() != seed.port())
        .unwrap();
    let err = client.lock(name).unwrap().try_lock().unwrap_err();
    assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    assert!(err.to_string().contains("Topology::cluster"), "{err}");
}

#[test]
fn one_server_given_as_a_cluster_is_a_clear_error() {
    let server = RedisServer::start();
    let client = Client::builder(Topology::cluster([server.url()]))
        .build()
        .unwrap();
    let err = client.lock("x").unwrap().try_lock().unwrap_err();
    assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not a Redis Cluster node"),
        "{err}"
    );
}

#[test]
fn a_slot_no_master_serves_is_a_clear_error() {
    let deployment = Deployment::start(Kind::Cluster);
    let cluster = deployment.cluster();
    let slot = cluster.slot_of(&lock_key("orphan"));
    // Otherwise the whole cluster refuses commands once a slot is lost.
    for master in cluster.masters() {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query::<()>(&mut master.connection())
            .unwrap();
    }
    redis::cmd("CLUSTER")
        .arg("DELSLOTS")
        .arg(slot)
        .query::<()>(&mut cluster.master_of_slot(slot).connection())
        .unwrap();
    let client = deployment.client();
    let err = client.lock("orphan").unwrap().try_lock().unwrap_err();
    assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("slot {slot}")), "{err}");
    // The other slots still work.
    let other = SPREAD
        .iter()
        .find(|n| cluster.slot_of(&lock_key(n)) != slot)
        .unwrap();
    assert!(client.lock(other).unwrap().try_lock().unwrap().is_some());
}

#[test]
fn a_renewed_holder_with_replica_acks_keeps_its_lock_across_the_failover_of_its_master() {
    let cluster = RedisCluster::start(3, 1);
    let seeds = cluster.seed_urls();
    let lease = Duration::from_secs(6);
    // replica_acks: the lock is granted only once the replica has it (a
    // WAIT on another connection would not say so: it waits for that
    // connection's own writes).
    let holder = Client::builder(Topology::cluster(&seeds))
        .io_timeout(Duration::from_secs(1))
        .default_lease(lease)
        .replica_acks(1, Duration::from_millis(500))
        .build()
        .unwrap();
    let name = "renewed-through-failover";
    let master = cluster.master_of_slot(cluster.slot_of(&lock_key(name)));
    let guard = holder.lock(name).unwrap().lock().unwrap();
    master.kill();
    // Past the lease: only renewals on the promoted replica kept it.
    thread::sleep(lease + Duration::from_secs(2));
    assert!(
        !guard.is_lost(),
        "the watchdog followed the slot to its new master"
    );

    let other = Client::builder(Topology::cluster(&seeds))
        .io_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let lock = other.lock(name).unwrap();
    assert_eq!(
        lock.holder().unwrap().expect("held").fencing_token,
        guard.fencing_token()
    );
    assert!(lock
        .try_lock_for(Duration::from_millis(500))
        .unwrap()
        .is_none());
    // No replica is left to confirm the release: said, and it stands on
    // the new master.
    let released = guard.unlock();
    assert!(
        matches!(released, Err(Error::NotReplicated { .. })),
        "{released:?}"
    );
    assert!(lock.try_lock().unwrap().is_some());
}

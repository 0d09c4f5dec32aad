//! A throwaway Redis Cluster: masters (each with its replicas) of
//! `redis-server --cluster-enabled yes` on free loopback ports, joined with
//! `CLUSTER MEET`, given slots with `CLUSTER ADDSLOTSRANGE` and replicas
//! with `CLUSTER REPLICATE`. Every server is killed when the value drops.

use std::thread;
use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// How long a cluster gets to agree on its configuration and sync its
/// replicas: a few seconds on a quiet machine, but a CI run of the whole
/// suite on 2 cores once took more than 30 s to bring one replica in sync.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// A node's failure-detection timeout: short, so that tests of a failover
/// see it within seconds.
const NODE_TIMEOUT_MS: &str = "1000";

/// A small Redis Cluster on 127.0.0.1.
#[derive(Debug)]
pub struct RedisCluster {
    masters: Vec<RedisServer>,
    /// `replicas[m]` replicate `masters[m]`.
    replicas: Vec<Vec<RedisServer>>,
}

impl RedisCluster {
    /// Starts `masters` masters that share the slots evenly, each with
    /// `replicas_per_master` replicas, and waits until every node reports
    /// `cluster_state:ok` and every replica is in sync.
    ///
    /// # Panics
    ///
    /// When a server does not start or the cluster does not form within
    /// 60 s (with what is missing).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs a master");
        let node = || {
            RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                NODE_TIMEOUT_MS,
            ])
        };
        let masters: Vec<RedisServer> = (0..masters).map(|_| node()).collect();
        let replicas: Vec<Vec<RedisServer>> = (0..masters.len())
            .map(|_| (0..replicas_per_master).map(|_| node()).collect())
            .collect();
        let cluster = RedisCluster { masters, replicas };
        cluster.assign_slots();
        cluster.meet_all();
        cluster.wait_until("every node knows every other", |c| c.all_nodes_known());
        cluster.attach_replicas();
        cluster.wait_until("cluster_state:ok on every node", |c| c.all_ok());
        cluster.wait_until("every replica in sync", |c| c.replicas_in_sync());
        cluster
    }

    /// The masters, in slot order: master `i` serves an even share of the
    /// slots, starting at `i * 16384 / n`.
    pub fn masters(&self) -> &[RedisServer] {
        &self.masters
    }

    /// The replicas of master `i`.
    pub fn replicas_of(&self, master: usize) -> &[RedisServer] {
        &self.replicas[master]
    }

    /// Every node: masters, then replicas.
    pub fn nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.masters.iter().chain(self.replicas.iter().flatten())
    }

    /// `redis://127.0.0.1:PORT/` of every master, to seed a client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.masters.iter().map(RedisServer::url).collect()
    }

    /// The slot `key` hashes to, as the cluster computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.masters[0].connection())
            .expect("CLUSTER KEYSLOT")
    }

    /// The master that was given `slot` when the cluster was formed.
    pub fn master_of_slot(&self, slot: u16) -> &RedisServer {
        let index = usize::from(slot) * self.masters.len() / usize::from(SLOTS);
        &self.masters[index]
    }

    /// `CLUSTER MYID` of `node`.
    pub fn node_id(node: &RedisServer) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node.connection())
            .expect("CLUSTER MYID")
    }

    /// `CLUSTER SETSLOT <slot> <args...>` on `node` (`IMPORTING <id>`,
    /// `MIGRATING <id>`, `NODE <id>`): the steps of a reshard.
    pub fn set_slot(node: &RedisServer, slot: u16, args: &[&str]) {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query::<()>(&mut node.connection())
            .expect("CLUSTER SETSLOT");
    }

    /// Moves every key of `slot` from `from` to `to` with `MIGRATE`, in
    /// batches, as a reshard between `IMPORTING`/`MIGRATING` and `NODE`
    /// does; a refused batch is sent again. Returns how many keys moved.
    ///
    /// # Panics
    /// When keys are still on `from` after 10 s.
    pub fn move_slot_keys(slot: u16, from: &RedisServer, to: &RedisServer) -> usize {
        let mut moved = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut from.connection())
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                return moved;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "keys of slot {slot} still on the source: {keys:?}"
            );
            let migrated = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to.port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query::<()>(&mut from.connection());
            match migrated {
                Ok(()) => moved += keys.len(),
                Err(error) => {
                    eprintln!("MIGRATE {keys:?}: {error} (retrying)");
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
    }

    fn assign_slots(&self) {
        let n = self.masters.len();
        for (i, master) in self.masters.iter().enumerate() {
            let first = i * usize::from(SLOTS) / n;
            let last = (i + 1) * usize::from(SLOTS) / n - 1;
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query::<()>(&mut master.connection())
                .expect("CLUSTER ADDSLOTSRANGE");
        }
    }

    fn meet_all(&self) {
        let first = self.masters[0].port();
        for node in self.nodes().skip(1) {
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(first)
                .query::<()>(&mut node.connection())
                .expect("CLUSTER MEET");
        }
    }

    fn attach_replicas(&self) {
        for (master, replicas) in self.masters.iter().zip(&self.replicas) {
            let id: String = redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut master.connection())
                .expect("CLUSTER MYID");
            for replica in replicas {
                redis::cmd("CLUSTER")
                    .arg("REPLICATE")
                    .arg(&id)
                    .query::<()>(&mut replica.connection())
                    .expect("CLUSTER REPLICATE");
            }
        }
    }

    fn all_nodes_known(&self) -> bool {
        let total = self.nodes().count();
        self.nodes().all(|node| {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut node.connection())
                .unwrap_or_default();
            nodes.lines().filter(|l| !l.contains("handshake")).count() == total
        })
    }

    fn all_ok(&self) -> bool {
        self.nodes().all(|node| {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut node.connection())
                .unwrap_or_default();
            info.contains("cluster_state:ok")
        })
    }

    fn replicas_in_sync(&self) -> bool {
        self.replicas.iter().flatten().all(|replica| {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut replica.connection())
                .unwrap_or_default();
            info.contains("master_link_status:up")
        })
    }

    fn wait_until(&self, what: &str, done: impl Fn(&RedisCluster) -> bool) {
        let deadline = Instant::now() + FORM_TIMEOUT;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "the test cluster did not form within {FORM_TIMEOUT:?}: no {what}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The slot of one key moving from the master that serves it to another,
/// one step at a time, as `redis-cli --cluster reshard` moves it:
/// [`begin`](SlotMigration::begin), [`move_keys`](SlotMigration::move_keys),
/// [`finish`](SlotMigration::finish).
#[derive(Debug)]
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    /// The slot that moves.
    pub slot: u16,
    /// The master that serves it now.
    pub from: &'a RedisServer,
    /// The node it moves to.
    pub to: &'a RedisServer,
}

impl<'a> SlotMigration<'a> {
    /// The slot of `key`, to another master of `cluster`.
    ///
    /// # Panics
    /// When the cluster has one master.
    pub fn of(cluster: &'a RedisCluster, key: &str) -> Self {
        let from = cluster.master_of_slot(cluster.slot_of(key));
        let to = cluster
            .masters()
            .iter()
            .find(|m| m.port() != from.port())
            .expect("a second master");
        SlotMigration::to(cluster, key, to)
    }

    /// The slot of `key`, to the node `to` (a master of `cluster`, or one
    /// that joins it).
    pub fn to(cluster: &'a RedisCluster, key: &str, to: &'a RedisServer) -> Self {
        let slot = cluster.slot_of(key);
        SlotMigration {
            cluster,
            slot,
            from: cluster.master_of_slot(slot),
            to,
        }
    }

    /// `CLUSTER SETSLOT` of this slot on `node` (see
    /// [`RedisCluster::set_slot`]).
    pub fn set_slot(&self, node: &RedisServer, args: &[&str]) {
        RedisCluster::set_slot(node, self.slot, args);
    }

    /// IMPORTING on the target, MIGRATING on the source: no key moved yet,
    /// as between two `MIGRATE` batches of a reshard.
    pub fn begin(&self) {
        self.set_slot(self.to, &["IMPORTING", &RedisCluster::node_id(self.from)]);
        self.set_slot(self.from, &["MIGRATING", &RedisCluster::node_id(self.to)]);
    }

    /// Every key of the slot to the target (see
    /// [`RedisCluster::move_slot_keys`]); returns how many moved.
    pub fn move_keys(&self) -> usize {
        RedisCluster::move_slot_keys(self.slot, self.from, self.to)
    }

    /// The target owns the slot, on itself, the source and every master.
    pub fn finish(&self) {
        let to = RedisCluster::node_id(self.to);
        self.set_slot(self.to, &["NODE", &to]);
        self.set_slot(self.from, &["NODE", &to]);
        for master in self.cluster.masters() {
            self.set_slot(master, &["NODE", &to]);
        }
    }
}

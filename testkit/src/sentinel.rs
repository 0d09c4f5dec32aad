//! A throwaway Sentinel deployment: one master, its replicas
//! (`--replicaof`), and sentinels watching the master under a service name,
//! all on free loopback ports and killed when the value drops.

use std::thread;
use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// How long the deployment gets to come together.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A master, its replicas and the sentinels that watch them.
#[derive(Debug)]
pub struct RedisSentinels {
    service: String,
    master: RedisServer,
    replicas: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Starts a master with `replicas` replicas and `sentinels` sentinels
    /// (quorum: a majority of them) watching it as `service`, with short
    /// timeouts (down after 1 s) so that a failover happens within seconds.
    /// Waits until every replica is in sync and every sentinel knows the
    /// replicas and the other sentinels.
    ///
    /// # Panics
    ///
    /// When a server does not start or the deployment does not come
    /// together within 30 s.
    pub fn start(service: &str, replicas: usize, sentinels: usize) -> RedisSentinels {
        assert!(sentinels >= 1, "a deployment needs a sentinel");
        let master = RedisServer::start();
        let master_port = master.port().to_string();
        let replicas: Vec<RedisServer> = (0..replicas)
            .map(|_| RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port]))
            .collect();
        let quorum = sentinels / 2 + 1;
        let config = format!(
            "sentinel monitor {service} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {service} 1000\n\
             sentinel failover-timeout {service} 5000\n\
             sentinel parallel-syncs {service} 1\n"
        );
        let sentinels: Vec<RedisServer> = (0..sentinels)
            .map(|_| RedisServer::start_configured(&config, &["--sentinel"]))
            .collect();
        let deployment = RedisSentinels {
            service: service.to_owned(),
            master,
            replicas,
            sentinels,
        };
        deployment.wait_until("every replica in sync", |d| d.replicas_in_sync());
        deployment.wait_until("every sentinel to know the others and the replicas", |d| {
            d.sentinels_informed()
        });
        deployment
    }

    /// The service name the sentinels know the master by.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The master the deployment started with (after a failover, no longer
    /// the master: ask [`RedisSentinels::current_master_port`]).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The replicas the deployment started with.
    pub fn replicas(&self) -> &[RedisServer] {
        &self.replicas
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// `redis://127.0.0.1:PORT/` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The master's port, as the first sentinel that answers reports it.
    pub fn current_master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.service)
                .query(&mut sentinel.try_connection().ok()?)
                .ok()?;
            addr.map(|(_, port)| port)
        })
    }

    fn replicas_in_sync(&self) -> bool {
        self.replicas.iter().all(|replica| {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut replica.connection())
                .unwrap_or_default();
            info.contains("master_link_status:up")
        })
    }

    fn sentinels_informed(&self) -> bool {
        let count = |sentinel: &RedisServer, what: &str| -> usize {
            redis::cmd("SENTINEL")
                .arg(what)
                .arg(&self.service)
                .query::<Vec<redis::Value>>(&mut sentinel.connection())
                .map_or(0, |entries| entries.len())
        };
        self.sentinels.iter().all(|sentinel| {
            count(sentinel, "REPLICAS") == self.replicas.len()
                && count(sentinel, "SENTINELS") == self.sentinels.len() - 1
        })
    }

    fn wait_until(&self, what: &str, done: impl Fn(&RedisSentinels) -> bool) {
        let deadline = Instant::now() + FORM_TIMEOUT;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "the test sentinels did not come together within {FORM_TIMEOUT:?}: waiting for {what}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

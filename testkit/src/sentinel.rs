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
    passwords: Passwords,
}

/// The passwords of a [`RedisSentinels`] deployment: of its data servers
/// (master and replicas, `requirepass`), and of its sentinels, each
/// independent of the other, as deployments have them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Passwords {
    /// The master's and the replicas' password; `None`: none.
    pub data: Option<String>,
    /// The sentinels' password; `None`: none.
    pub sentinels: Option<String>,
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
        RedisSentinels::start_with_passwords(service, replicas, sentinels, Passwords::default())
    }

    /// [`RedisSentinels::start`] with `passwords` on the data servers
    /// and on the sentinels (set once each server answers, so that the
    /// readiness checks need none; the sentinels are told the data
    /// servers' password, `auth-pass`, and each other's, `sentinel-pass`).
    pub fn start_with_passwords(
        service: &str,
        replicas: usize,
        sentinels: usize,
        passwords: Passwords,
    ) -> RedisSentinels {
        assert!(sentinels >= 1, "a deployment needs a sentinel");
        let masterauth: Vec<&str> = match &passwords.data {
            Some(password) => vec!["--masterauth", password],
            None => Vec::new(),
        };
        let master = RedisServer::start_with(&masterauth);
        let master_port = master.port().to_string();
        let replicas: Vec<RedisServer> = (0..replicas)
            .map(|_| {
                let mut args = vec!["--replicaof", "127.0.0.1", &master_port];
                args.extend(&masterauth);
                RedisServer::start_with(&args)
            })
            .collect();
        if let Some(password) = &passwords.data {
            for server in std::iter::once(&master).chain(&replicas) {
                set_password(server, password);
            }
        }
        let quorum = sentinels / 2 + 1;
        // down-after 2 s, not 1 s: a sentinel pings every second at most,
        // and at 1 s one that had just switched to a new master sometimes
        // marked it down before its first reply came, failing over a
        // second time to a master with no replica for ~10 s (seen in the
        // fault matrix on Redis 7.0).
        let mut config = format!(
            "sentinel monitor {service} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {service} 2000\n\
             sentinel failover-timeout {service} 5000\n\
             sentinel parallel-syncs {service} 1\n"
        );
        if let Some(password) = &passwords.data {
            config.push_str(&format!("sentinel auth-pass {service} {password}\n"));
        }
        if let Some(password) = &passwords.sentinels {
            config.push_str(&format!("sentinel sentinel-pass {password}\n"));
        }
        let sentinels: Vec<RedisServer> = (0..sentinels)
            .map(|_| RedisServer::start_configured(&config, &["--sentinel"]))
            .collect();
        if let Some(password) = &passwords.sentinels {
            for sentinel in &sentinels {
                set_password(sentinel, password);
            }
        }
        let deployment = RedisSentinels {
            service: service.to_owned(),
            master,
            replicas,
            sentinels,
            passwords,
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

    /// `redis://127.0.0.1:PORT/` of every sentinel, with the sentinels'
    /// password when they have one.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| with_password(sentinel, self.passwords.sentinels.as_deref()))
            .collect()
    }

    /// The passwords the deployment was started with.
    pub fn passwords(&self) -> &Passwords {
        &self.passwords
    }

    /// A connection to `server` (one of this deployment's data servers)
    /// with the data servers' password.
    pub fn data_connection(&self, server: &RedisServer) -> redis::Connection {
        connect(server, self.passwords.data.as_deref())
    }

    /// The master's port, as the first sentinel that answers reports it.
    pub fn current_master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.service)
                .query(&mut try_connect(sentinel, self.passwords.sentinels.as_deref()).ok()?)
                .ok()?;
            addr.map(|(_, port)| port)
        })
    }

    fn replicas_in_sync(&self) -> bool {
        self.replicas.iter().all(|replica| {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut self.data_connection(replica))
                .unwrap_or_default();
            info.contains("master_link_status:up")
        })
    }

    fn sentinels_informed(&self) -> bool {
        let count = |sentinel: &RedisServer, what: &str| -> usize {
            redis::cmd("SENTINEL")
                .arg(what)
                .arg(&self.service)
                .query::<Vec<redis::Value>>(&mut connect(
                    sentinel,
                    self.passwords.sentinels.as_deref(),
                ))
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

/// `redis://[:password@]127.0.0.1:PORT/` of `server`.
fn with_password(server: &RedisServer, password: Option<&str>) -> String {
    match password {
        Some(password) => format!("redis://:{password}@127.0.0.1:{}/", server.port()),
        None => server.url(),
    }
}

fn try_connect(
    server: &RedisServer,
    password: Option<&str>,
) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(with_password(server, password))?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(5))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}

fn connect(server: &RedisServer, password: Option<&str>) -> redis::Connection {
    try_connect(server, password)
        .unwrap_or_else(|err| panic!("cannot connect to port {}: {err}", server.port()))
}

/// Makes the default user of `server` (a data server or a sentinel: both
/// take ACL SETUSER) need `password`.
fn set_password(server: &RedisServer, password: &str) {
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("resetpass")
        .arg(format!(">{password}"))
        .query::<()>(&mut server.connection())
        .unwrap_or_else(|err| panic!("cannot set the password of port {}: {err}", server.port()));
}

//! What a cell tells its processes: the deployment's addresses, the
//! synchronizer, the client's settings. Passed to child processes as one
//! line of text (`key=value;...`) in place of a URL.

use std::time::Duration;

use redbaton::Client;

use crate::support::SERVICE;

/// The synchronizers of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    Lock,
    Fair,
    RwLock,
    Semaphore,
    Latch,
    Rate,
    /// A multi-lock over two names, contended by single-name lockers of
    /// each name too.
    Multi,
}

/// The deployments of the matrix (the support's topologies, by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deploy {
    Single,
    Cluster,
    Sentinel,
    Masters,
}

impl Sync {
    fn code(self) -> &'static str {
        match self {
            Sync::Lock => "lock",
            Sync::Fair => "fair",
            Sync::RwLock => "rw",
            Sync::Semaphore => "sem",
            Sync::Latch => "latch",
            Sync::Rate => "rate",
            Sync::Multi => "multi",
        }
    }

    fn parse(code: &str) -> Sync {
        [
            Sync::Lock,
            Sync::Fair,
            Sync::RwLock,
            Sync::Semaphore,
            Sync::Latch,
            Sync::Rate,
            Sync::Multi,
        ]
        .into_iter()
        .find(|s| s.code() == code)
        .unwrap_or_else(|| panic!("unknown synchronizer {code}"))
    }
}

impl Deploy {
    fn code(self) -> &'static str {
        match self {
            Deploy::Single => "single",
            Deploy::Cluster => "cluster",
            Deploy::Sentinel => "sentinel",
            Deploy::Masters => "masters",
        }
    }

    fn parse(code: &str) -> Deploy {
        [
            Deploy::Single,
            Deploy::Cluster,
            Deploy::Sentinel,
            Deploy::Masters,
        ]
        .into_iter()
        .find(|d| d.code() == code)
        .unwrap_or_else(|| panic!("unknown deployment {code}"))
    }
}

/// Everything a process of a cell needs to build its client and work.
#[derive(Debug, Clone)]
pub struct Spec {
    pub sync: Sync,
    pub deploy: Deploy,
    /// The deployment's URLs: one server, cluster seeds, sentinels, masters.
    pub urls: Vec<String>,
    /// The witness server: occupancy markers, results, the stop flag.
    pub witness: String,
    /// The synchronizer's name.
    pub name: String,
    pub lease: Duration,
    pub max_park: Duration,
    /// `replica_acks(1, 300 ms)` (the sentinel deployment's setting).
    pub replica_acks: bool,
    /// Worker threads per process.
    pub threads: usize,
    /// How long a holder stays inside.
    pub hold: Duration,
    /// Semaphore permits, or rate limiter permits per second.
    pub permits: u64,
    /// The most permits the occupancy marker may see at once.
    pub cap: u64,
}

impl Spec {
    /// One line of text for a child process.
    pub fn encode(&self) -> String {
        format!(
            "sync={};deploy={};urls={};witness={};name={};lease={};max_park={};acks={};threads={};hold={};permits={};cap={}",
            self.sync.code(),
            self.deploy.code(),
            self.urls.join(","),
            self.witness,
            self.name,
            self.lease.as_millis(),
            self.max_park.as_millis(),
            u8::from(self.replica_acks),
            self.threads,
            self.hold.as_millis(),
            self.permits,
            self.cap
        )
    }

    /// The spec [`Spec::encode`] wrote.
    pub fn decode(text: &str) -> Spec {
        let field = |key: &str| -> &str {
            text.split(';')
                .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {key} in {text}"))
        };
        let millis = |key: &str| Duration::from_millis(field(key).parse().unwrap());
        Spec {
            sync: Sync::parse(field("sync")),
            deploy: Deploy::parse(field("deploy")),
            urls: field("urls").split(',').map(str::to_owned).collect(),
            witness: field("witness").to_owned(),
            name: field("name").to_owned(),
            lease: millis("lease"),
            max_park: millis("max_park"),
            replica_acks: field("acks") == "1",
            threads: field("threads").parse().unwrap(),
            hold: millis("hold"),
            permits: field("permits").parse().unwrap(),
            cap: field("cap").parse().unwrap(),
        }
    }

    /// The lock names the synchronizer takes: [`Spec::name`], and for a
    /// multi-lock a second one (its own hash tag, so on a cluster most
    /// likely another slot).
    pub fn names(&self) -> Vec<String> {
        match self.sync {
            Sync::Multi => vec![self.name.clone(), format!("{}:2", self.name)],
            _ => vec![self.name.clone()],
        }
    }

    /// A client of the deployment with the cell's settings.
    pub fn client(&self) -> Client {
        let urls = self.urls.iter().map(String::as_str);
        let topology = match self.deploy {
            Deploy::Single => redbaton::Topology::server(&self.urls[0]),
            Deploy::Cluster => redbaton::Topology::cluster(urls),
            Deploy::Sentinel => redbaton::Topology::sentinel(SERVICE, urls),
            Deploy::Masters => redbaton::Topology::masters(urls),
        };
        let mut builder = Client::builder(topology)
            .io_timeout(Duration::from_secs(2))
            .default_lease(self.lease)
            .max_park(self.max_park);
        if self.replica_acks {
            builder = builder.replica_acks(1, Duration::from_millis(300));
        }
        builder
            .build()
            .expect("the cell's client settings are valid")
    }

    /// A connection to the witness server.
    pub fn witness(&self) -> redis::Connection {
        redis::Client::open(self.witness.as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

//! What the driver measures on the deployment itself: the commands its
//! servers ran (`INFO commandstats`), and keys left without a TTL.

use std::collections::BTreeMap;
use std::time::Duration;

use testkit::RedisServer;

use crate::support::Deployment;

/// Every data server of the deployment (sentinels left out).
pub fn servers(deployment: &Deployment) -> Vec<&RedisServer> {
    match deployment.topology() {
        crate::support::Topology::Single => vec![deployment.server()],
        crate::support::Topology::Cluster => deployment.cluster().nodes().collect(),
        crate::support::Topology::Sentinel => {
            let sentinels = deployment.sentinels();
            std::iter::once(sentinels.master())
                .chain(sentinels.replicas())
                .collect()
        }
        crate::support::Topology::Masters => deployment.servers_for("any"),
    }
}

/// A connection that gives up quickly: a killed or stopped server is
/// left out of the figures rather than stalling them.
fn quick_connection(server: &RedisServer) -> Option<redis::Connection> {
    let client = redis::Client::open(server.url()).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    Some(conn)
}

/// The commands a client sends itself (`INFO commandstats` counts the
/// commands scripts call too, under their own names; these no script
/// calls). The test's own commands to the deployment are none of them.
const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "blpop",
    "cluster|slots",
    "cluster|shards",
    "asking",
    "client|unblock",
    "client|id",
    "script|load",
    "ping",
    "role",
];

/// Calls per command on every server that answers, summed by port and
/// command.
pub fn snapshot(deployment: &Deployment) -> BTreeMap<(u16, String), u64> {
    let mut calls = BTreeMap::new();
    for server in servers(deployment) {
        let Some(mut conn) = quick_connection(server) else {
            continue;
        };
        let Ok(info) = redis::cmd("INFO")
            .arg("commandstats")
            .query::<String>(&mut conn)
        else {
            continue;
        };
        for (command, count) in testkit::parse_commandstats(&info) {
            calls.insert((server.port(), command), count);
        }
    }
    calls
}

/// The library's commands between two snapshots (a server missing from
/// either is left out: it was down).
pub fn commands_between(
    before: &BTreeMap<(u16, String), u64>,
    after: &BTreeMap<(u16, String), u64>,
) -> u64 {
    let ports_before: Vec<u16> = before.keys().map(|(port, _)| *port).collect();
    after
        .iter()
        .filter(|((port, command), _)| {
            ports_before.contains(port) && CLIENT_COMMANDS.contains(&command.as_str())
        })
        .map(|(key, count)| count.saturating_sub(*before.get(key).unwrap_or(&0)))
        .sum()
}

/// The five commands sent most between two snapshots, for a failure
/// message.
pub fn top_commands(
    before: &BTreeMap<(u16, String), u64>,
    after: &BTreeMap<(u16, String), u64>,
) -> String {
    let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
    for ((port, command), count) in after {
        if !CLIENT_COMMANDS.contains(&command.as_str()) {
            continue;
        }
        let was = before.get(&(*port, command.clone())).copied().unwrap_or(0);
        *sums.entry(command.as_str()).or_default() += count.saturating_sub(was);
    }
    let mut sums: Vec<(&str, u64)> = sums.into_iter().collect();
    sums.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    sums.truncate(5);
    format!("{sums:?}")
}

/// Keys under the client's prefix, on every server that answers, that
/// have no TTL and are not one of the documented exceptions.
pub fn keys_without_ttl(deployment: &Deployment) -> Vec<String> {
    let mut found = Vec::new();
    // Under Sentinel, the master is the one the sentinels name: an old
    // master keeps its keys (and says "master") until they convert it,
    // which can take them seconds after the failover.
    let named = match deployment.topology() {
        crate::support::Topology::Sentinel => deployment.sentinels().current_master_port(),
        _ => None,
    };
    for server in servers(deployment) {
        if named.is_some_and(|port| port != server.port()) {
            continue;
        }
        let Some(mut conn) = quick_connection(server) else {
            continue;
        };
        let role: Vec<redis::Value> = match redis::cmd("ROLE").query(&mut conn) {
            Ok(role) => role,
            Err(_) => continue,
        };
        // A replica's keys are its master's.
        if !matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master") {
            continue;
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("redbaton:*")
            .query(&mut conn)
            .unwrap_or_default();
        for key in keys {
            if documented_without_ttl(&key) {
                continue;
            }
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap_or(-2);
            if ttl == -1 {
                found.push(format!("{key} (port {})", server.port()));
            }
        }
    }
    found
}

/// The key layout (docs/how-it-works.md): the identity counter (one per prefix), a rate
/// limiter's configuration and a semaphore's state (kept for the name's
/// life), a latch's count while it is not zero.
fn documented_without_ttl(key: &str) -> bool {
    key == "redbaton:identity"
        || key.ends_with(":rate:config")
        || key.ends_with(":sem:state")
        || key.ends_with(":latch:count")
}

//! The multi-lock's tests (issue 26): one binary, one module per area.

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod failures;
mod stress;
mod topologies;
mod waiting;

use redbaton::{Client, Lock};
use testkit::RedisServer;

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[stress::run_child]);
}

/// Whether any key of lock `name` is held in Redis, looked up on `server`.
fn exists(server: &RedisServer, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(support::lock_key(name))
        .query::<i64>(&mut server.connection())
        .unwrap()
        == 1
}

/// The owner identity of the calling thread under `client`, as Redis
/// stores it: read from a lock only this thread takes.
fn my_owner(client: &Client, tag: &str) -> redbaton::Owner {
    let lock: Lock = client.lock(&format!("owner-probe-{tag}")).unwrap();
    let guard = lock.lock().unwrap();
    let owner = lock.holder().unwrap().unwrap().owner;
    guard.unlock().unwrap();
    owner
}

//! The read-write lock's tests: one binary, one module per area. Child
//! processes re-run this binary on `child_entry`, which hands the role to
//! the module that owns it.

#[path = "../support/mod.rs"]
mod support;

mod bookkeeping;
mod cleanup;
mod errors;
mod grants;
mod leases;
mod preference;
mod processes;
mod reentry;
#[cfg(feature = "sentinel")]
mod replicas;
mod resent;
mod upgradable;
mod upgradable_holds;
mod waiting;
mod write_grants;

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[processes::run_child, upgradable_holds::run_child]);
}

/// A key of read-write lock `name` under the default prefix, as the
/// key layout (docs/how-it-works.md) gives it: `part` is `write`, `readers`, `depths`,
/// `writers`, `rbaton`, `wbaton`, `fence`, `upgradable`, `ubaton`,
/// `upbaton`, `rgrants` or `wgrants`.
pub fn rw_key(name: &str, part: &str) -> String {
    format!("redbaton:{{{}}}:rw:{part}", support::hash_tag(name))
}

/// Everything Redis holds for read-write lock `name` (but its fencing
/// counter and batons), in a form to compare.
pub fn rw_state(conn: &mut redis::Connection, name: &str) -> Vec<String> {
    let mut state = Vec::new();
    let write: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(rw_key(name, "write"))
        .query(conn)
        .unwrap();
    state.push(format!("write {write:?}"));
    let readers: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(rw_key(name, "readers"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap();
    state.push(format!("readers {readers:?}"));
    let depths: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(rw_key(name, "depths"))
        .query(conn)
        .unwrap();
    state.push(format!("depths {depths:?}"));
    let writers: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(rw_key(name, "writers"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap();
    state.push(format!("writers {writers:?}"));
    let upgradable: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(rw_key(name, "upgradable"))
        .query(conn)
        .unwrap();
    state.push(format!("upgradable {upgradable:?}"));
    state
}

/// How many writers keep a place in the queue of `name`.
pub fn waiting_writers(conn: &mut redis::Connection, name: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(rw_key(name, "writers"))
        .query(conn)
        .unwrap()
}

/// The crate's read-write lock script `name` (`read`, `write`,
/// `release_read`, `release_write`) with its `lib/` helpers prepended as
/// the crate sends it: the same source, so the same SHA, called with
/// `EVALSHA` like the crate calls it.
pub fn rw_script(name: &str) -> redis::Script {
    let source = match name {
        "read" => concat!(
            include_str!("../../src/scripts/lib/rw.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/rwlock/read.lua")
        ),
        "write" => concat!(
            include_str!("../../src/scripts/lib/rw.lua"),
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/rwlock/write.lua")
        ),
        "release_read" => concat!(
            include_str!("../../src/scripts/lib/rw.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/grant_message.lua"),
            include_str!("../../src/scripts/lib/write_grant.lua"),
            include_str!("../../src/scripts/rwlock/release_read.lua")
        ),
        "release_write" => concat!(
            include_str!("../../src/scripts/lib/rw.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/grant_message.lua"),
            include_str!("../../src/scripts/lib/write_grant.lua"),
            include_str!("../../src/scripts/rwlock/release_write.lua")
        ),
        _ => panic!("no read-write lock script {name}"),
    };
    redis::Script::new(source)
}

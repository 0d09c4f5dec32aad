//! The semaphore's tests: one binary, one module per area. Child processes
//! re-run this binary on `child_entry`, which hands the role to the module
//! that owns it.

#[path = "../support/mod.rs"]
mod support;

mod bookkeeping;
mod counting;
mod errors;
mod grants;
mod leases;
mod processes;
#[cfg(feature = "sentinel")]
mod replicas;
mod resends;
mod waiting;

/// Handles go to threads; permits may be released from another thread.
#[allow(dead_code)]
fn handles_are_send_and_sync_and_permits_are_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<redbaton::Semaphore>();
    send::<redbaton::SemaphorePermit>();
}

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[processes::run_child]);
}

/// The keys of semaphore `name` under the default prefix, as docs/how-it-works.md
/// documents them (names used in tests contain no `%`, `{` or `}`):
/// state, holders, counts, waiters, baton, reserved baton.
pub(crate) fn sem_keys(name: &str) -> [String; 6] {
    ["state", "holders", "counts", "waiters", "baton", "rbaton"]
        .map(|part| format!("redbaton:{{{}}}:sem:{part}", support::hash_tag(name)))
}

/// Puts a live place among `name`'s waiters, as a waiter for one permit
/// that never comes back would have left it (its place never ends): a
/// release or an acquisition then has someone to wake.
pub(crate) fn place_a_waiter(raw: &mut redis::Connection, name: &str) {
    let [_, _, _, waiters, ..] = sem_keys(name);
    redis::cmd("ZADD")
        .arg(&waiters)
        .arg(i64::MAX / 4)
        .arg("1:another-waiter")
        .query::<()>(raw)
        .unwrap();
}

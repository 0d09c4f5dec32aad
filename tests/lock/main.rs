//! The lock's tests: one binary, one module per area. Child processes
//! re-run this binary on `child_entry`, which hands the role to the module
//! that owns it.

#[path = "../support/mod.rs"]
mod support;

mod at_scale;
mod barging;
#[cfg(feature = "cluster")]
mod cluster;
mod errors;
mod faults;
mod grants;
mod handoff;
mod leaks;
mod leases;
mod liveness;
mod locking;
#[cfg(feature = "cluster")]
mod migration;
mod passing;
mod precise_wakeups;
mod processes;
#[cfg(feature = "redlock")]
mod redlock;
#[cfg(feature = "redlock")]
mod redlock_limits;
#[cfg(feature = "redlock")]
mod redlock_replies;
mod refusals;
mod resent;
mod safety;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
#[cfg(feature = "sentinel")]
mod sentinel_credentials;
mod topologies;
mod usual_paths;
mod waiting;
mod windows;

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[
        handoff::run_child,
        passing::run_child,
        leases::run_child,
        processes::run_child,
        #[cfg(feature = "cluster")]
        cluster::run_child,
        #[cfg(feature = "redlock")]
        redlock::run_child,
    ]);
}

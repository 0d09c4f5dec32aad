//! `#[redbaton::locked]`: what it compiles to (`compile`, through trybuild)
//! and how locked functions behave against real redis-servers, between
//! threads and between processes. Child processes re-run this binary on
//! `child_entry`, which hands the role to the module that owns it.

#[path = "../support/mod.rs"]
mod support;

mod compile;

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[]);
}

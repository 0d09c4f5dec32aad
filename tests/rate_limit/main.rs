//! The rate limiter's tests: budgets across threads and processes, and bad
//! input. Child processes re-run this binary on `child_entry`.

#[path = "../support/mod.rs"]
mod support;

mod budgets;
mod errors;

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[budgets::run_child]);
}

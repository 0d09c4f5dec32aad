//! `#[redbaton::locked]`: what it compiles to (`compile`, through trybuild)
//! and how locked functions behave against real redis-servers, between
//! threads (`calls`, `multi` for `keys = [ … ]`) and between processes (`processes`). Child processes
//! re-run this binary on `child_entry`, which hands the role to the module
//! that owns it.

#[path = "../support/mod.rs"]
mod support;

mod calls;
mod compile;
mod multi;
mod processes;

/// The error type of the locked functions under test: redbaton's errors
/// arrive through `From`, as the attribute requires.
#[derive(Debug)]
pub(crate) enum AppError {
    Lock(redbaton::Error),
    Redis(redis::RedisError),
    Declined,
}

impl From<redbaton::Error> for AppError {
    fn from(error: redbaton::Error) -> Self {
        AppError::Lock(error)
    }
}

impl From<redis::RedisError> for AppError {
    fn from(error: redis::RedisError) -> Self {
        AppError::Redis(error)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(error) => write!(f, "lock: {error}"),
            AppError::Redis(error) => write!(f, "redis: {error}"),
            AppError::Declined => f.write_str("declined"),
        }
    }
}

impl AppError {
    /// The lock name of a `Busy` error, `None` for any other.
    pub(crate) fn busy_name(&self) -> Option<&str> {
        match self {
            AppError::Lock(redbaton::Error::Busy { name }) => Some(name),
            _ => None,
        }
    }
}

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[processes::run_child]);
}

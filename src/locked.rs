//! What `#[redbaton::locked]` functions call: the one place that turns an
//! attribute's options into a guard or an error.
//!
//! The macro (crate `redbaton-macros`) only parses and checks at compile
//! time; everything that happens at run time is here, as ordinary code
//! that the generated function calls through `redbaton::__private`. So the
//! generated code stays a few lines, and a change of behaviour is a change
//! to this file, tested like the rest of the crate.
//!
//! Nothing here is public API: `lib.rs` re-exports it under a
//! `#[doc(hidden)]` module that only the macro names.

use std::time::Duration;

use crate::client::Client;
use crate::error::Error;
use crate::sync::LockGuard;

/// How a locked function takes its lock, as its attribute says.
#[derive(Debug, Clone, Copy)]
pub struct LockOptions {
    /// `None`: one attempt (`try_lock`); `Some`: `try_lock_for` this long.
    pub wait: Option<Duration>,
    /// How the lock is kept alive while the function runs.
    pub lease: Lease,
}

/// The lease a locked function asks for.
#[derive(Debug, Clone, Copy)]
pub enum Lease {
    /// The client's `default_lease`, renewed by the watchdog.
    ClientDefault,
    /// `lease = "…"`: this lease, renewed ([`Lock::with_lease`]).
    ///
    /// [`Lock::with_lease`]: crate::Lock::with_lease
    Renewed(Duration),
    /// `fixed_lease = "…"`: this lease, never renewed
    /// ([`Lock::with_fixed_lease`]).
    ///
    /// [`Lock::with_fixed_lease`]: crate::Lock::with_fixed_lease
    Fixed(Duration),
}

/// Takes the lock `name` of `client` as `options` say, for the body of a
/// locked function.
///
/// # Errors
/// [`Error::Busy`] when someone else held the lock for the whole attempt
/// (or wait); the errors of [`Client::lock`], [`Lock::with_lease`] and
/// [`Lock::try_lock`] otherwise.
///
/// [`Lock::with_lease`]: crate::Lock::with_lease
/// [`Lock::try_lock`]: crate::Lock::try_lock
pub fn lock(client: &Client, name: &str, options: LockOptions) -> Result<LockGuard, Error> {
    let lock = client.lock(name)?;
    let lock = match options.lease {
        Lease::ClientDefault => lock,
        Lease::Renewed(lease) => lock.with_lease(lease)?,
        Lease::Fixed(lease) => lock.with_fixed_lease(lease)?,
    };
    let guard = match options.wait {
        None => lock.try_lock()?,
        Some(wait) => lock.try_lock_for(wait)?,
    };
    guard.ok_or_else(|| Error::Busy {
        name: name.to_owned(),
    })
}

/// A lock name: what a `key = { … }` block may yield. A trait of its own
/// (rather than `AsRef<str>`) so that a block of the wrong type gets an
/// error that says what the attribute expects.
#[diagnostic::on_unimplemented(
    message = "the `key` of `#[redbaton::locked]` must give the lock's name as a string, not `{Self}`",
    label = "this is not a `String` or `&str`",
    note = "end the `key = {{ … }}` block with a `String` or `&str`, such as `format!(\"order:{{}}\", order.id)`"
)]
pub trait LockName {
    /// The name as text.
    fn lock_name(&self) -> &str;
}

impl LockName for str {
    fn lock_name(&self) -> &str {
        self
    }
}

impl LockName for String {
    fn lock_name(&self) -> &str {
        self
    }
}

impl LockName for std::borrow::Cow<'_, str> {
    fn lock_name(&self) -> &str {
        self
    }
}

impl LockName for Box<str> {
    fn lock_name(&self) -> &str {
        self
    }
}

impl LockName for std::sync::Arc<str> {
    fn lock_name(&self) -> &str {
        self
    }
}

impl<T: LockName + ?Sized> LockName for &T {
    fn lock_name(&self) -> &str {
        (**self).lock_name()
    }
}

/// An error type a locked function can return redbaton's errors through.
/// A trait of its own (rather than a bare `From<Error>` bound) so that the
/// message names the attribute and says what to add.
#[diagnostic::on_unimplemented(
    message = "`#[redbaton::locked]` returns redbaton's errors (such as `Busy`) through `{Self}`, which has no `From<redbaton::Error>`",
    label = "the error type of this `Result` cannot hold a `redbaton::Error`",
    note = "add `impl From<redbaton::Error> for {Self}` (say, a variant that wraps it), or return a `Result` whose error type has one"
)]
pub trait FromLockError: Sized {
    /// Wraps `error`.
    fn from_lock_error(error: Error) -> Self;
}

impl<E: From<Error>> FromLockError for E {
    fn from_lock_error(error: Error) -> Self {
        E::from(error)
    }
}

/// The early return of a locked function whose lock could not be taken:
/// `Err(error)` in the function's own error type.
pub fn fail<T, E: FromLockError>(error: Error) -> Result<T, E> {
    Err(E::from_lock_error(error))
}

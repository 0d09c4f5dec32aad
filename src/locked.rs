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
use crate::sync::{LockGuard, MultiLockGuard, ReadGuard, SemaphorePermit, WriteGuard};

/// How a locked function takes its lock, as its attribute says.
#[derive(Debug, Clone, Copy)]
pub struct LockOptions {
    /// `None`: one attempt (`try_…`); `Some`: wait this long (`try_…_for`).
    pub wait: Option<Duration>,
    /// How the hold is kept alive while the function runs.
    pub lease: Lease,
    /// Which synchronizer the name is of.
    pub kind: Kind,
}

/// The lease a locked function asks for.
#[derive(Debug, Clone, Copy)]
pub enum Lease {
    /// The client's `default_lease`, renewed by the watchdog.
    ClientDefault,
    /// `lease = "…"`: this lease, renewed ([`Lock::with_lease`]); the
    /// macro allows it for locks and fair locks only.
    ///
    /// [`Lock::with_lease`]: crate::Lock::with_lease
    Renewed(Duration),
    /// `fixed_lease = "…"`: this lease, never renewed (`with_fixed_lease`
    /// of the handle).
    Fixed(Duration),
}

/// What a locked function holds while it runs.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// The lock (`Client::lock`).
    Lock,
    /// `fair`: the fair lock (`Client::fair_lock`).
    Fair,
    /// `rw = read`: the read-write lock, for reading.
    Read,
    /// `rw = write`: the read-write lock, for writing.
    Write,
    /// `semaphore` or `semaphore = N`: this many permits of the semaphore.
    Semaphore(u64),
}

/// The guard a locked function holds for its whole body.
#[derive(Debug)]
#[must_use = "the hold ends as soon as this is dropped"]
pub enum Held {
    /// A lock's or fair lock's guard.
    Lock(LockGuard),
    /// A read-write lock's read guard.
    Read(ReadGuard),
    /// A read-write lock's write guard.
    Write(WriteGuard),
    /// A semaphore's permits.
    Permit(SemaphorePermit),
}

impl Held {
    /// The fencing token of a lock or write hold (the macro allows
    /// `fencing` for those only); 0 for the others.
    pub fn fencing_token(&self) -> u64 {
        match self {
            Held::Lock(guard) => guard.fencing_token(),
            Held::Write(guard) => guard.fencing_token(),
            Held::Read(_) | Held::Permit(_) => 0,
        }
    }
}

/// Takes what `options` say of `client`'s object `name`, for the body of a
/// locked function.
///
/// # Errors
/// [`Error::Busy`] when it could not be had within the attempt (or wait);
/// the errors of the client's factories, of `with_lease` and
/// `with_fixed_lease`, and of the `try_…` calls otherwise.
pub fn lock(client: &Client, name: &str, options: LockOptions) -> Result<Held, Error> {
    let held = match options.kind {
        Kind::Lock | Kind::Fair => {
            let lock = match options.kind {
                Kind::Fair => client.fair_lock(name)?,
                _ => client.lock(name)?,
            };
            let lock = match options.lease {
                Lease::ClientDefault => lock,
                Lease::Renewed(lease) => lock.with_lease(lease)?,
                Lease::Fixed(lease) => lock.with_fixed_lease(lease)?,
            };
            match options.wait {
                None => lock.try_lock()?,
                Some(wait) => lock.try_lock_for(wait)?,
            }
            .map(Held::Lock)
        }
        Kind::Read | Kind::Write => {
            let rw = client.rw_lock(name)?;
            let rw = match options.lease {
                Lease::Fixed(lease) => rw.with_fixed_lease(lease)?,
                Lease::ClientDefault | Lease::Renewed(_) => rw,
            };
            match (options.kind, options.wait) {
                (Kind::Read, None) => rw.try_read()?.map(Held::Read),
                (Kind::Read, Some(wait)) => rw.try_read_for(wait)?.map(Held::Read),
                (_, None) => rw.try_write()?.map(Held::Write),
                (_, Some(wait)) => rw.try_write_for(wait)?.map(Held::Write),
            }
        }
        Kind::Semaphore(permits) => {
            let semaphore = client.semaphore(name)?;
            let semaphore = match options.lease {
                Lease::Fixed(lease) => semaphore.with_fixed_lease(lease)?,
                Lease::ClientDefault | Lease::Renewed(_) => semaphore,
            };
            match options.wait {
                None => semaphore.try_acquire_many(permits)?,
                Some(wait) => semaphore.try_acquire_many_for(permits, wait)?,
            }
            .map(Held::Permit)
        }
    };
    held.ok_or_else(|| Error::Busy {
        name: name.to_owned(),
    })
}

/// The guard of a function locked with `keys = [ … ]`: the multi-lock's,
/// with the fencing token of each name in the order of `keys`.
#[derive(Debug)]
#[must_use = "the hold ends as soon as this is dropped"]
pub struct HeldMany<const N: usize> {
    guard: MultiLockGuard,
    tokens: [u64; N],
}

impl<const N: usize> HeldMany<N> {
    /// The fencing token of each name, in the order of `keys` (a name
    /// given twice has its one token twice).
    pub fn fencing_tokens(&self) -> [u64; N] {
        self.tokens
    }

    /// The multi-lock's guard.
    pub fn guard(&self) -> &MultiLockGuard {
        &self.guard
    }
}

/// Takes the multi-lock over `names` of `client`, for the body of a
/// function locked with `keys = [ … ]`. `options.kind` is
/// [`Kind::Lock`]: the macro allows no other with `keys`.
///
/// # Errors
/// [`Error::Busy`] when some name was held by another thread or process
/// for the attempt (or the whole wait), naming the set (its names joined
/// by `", "`, in the multi-lock's order); the errors of
/// [`Client::multi_lock`], of `with_lease` and `with_fixed_lease`, and of
/// the `try_lock…` calls otherwise.
pub fn lock_many<const N: usize>(
    client: &Client,
    names: [&str; N],
    options: LockOptions,
) -> Result<HeldMany<N>, Error> {
    let multi = client.multi_lock(names)?;
    let multi = match options.lease {
        Lease::ClientDefault => multi,
        Lease::Renewed(lease) => multi.with_lease(lease)?,
        Lease::Fixed(lease) => multi.with_fixed_lease(lease)?,
    };
    let guard = match options.wait {
        None => multi.try_lock()?,
        Some(wait) => multi.try_lock_for(wait)?,
    };
    let Some(guard) = guard else {
        return Err(Error::Busy {
            name: multi.names().collect::<Vec<_>>().join(", "),
        });
    };
    // Every name is in the set the guard holds, so each has its token.
    let tokens = names.map(|name| guard.fencing_token(name).unwrap_or(0));
    Ok(HeldMany { guard, tokens })
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

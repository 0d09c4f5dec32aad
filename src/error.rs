//! The one error type of the crate.
//!
//! "Someone else holds the lock" is not an error: `try_lock` returns
//! `Ok(None)`; neither is "no permits left": `try_acquire` returns
//! `Ok(false)`. Errors are bad input, Redis failures, and lost ownership.
//! The one exception is [`Error::Busy`], for `#[redbaton::locked]`
//! functions: they return the function's own `Result`, which has no room
//! for "not acquired" but an error.

use std::time::Duration;

use redis::RedisError;

/// Everything that can go wrong in redbaton.
///
/// Each message says what to do; [`is_transient`](Error::is_transient)
/// tells which failures may pass by themselves. No call panics on bad
/// input or on a Redis failure. Messages never contain the Redis URL, so
/// passwords do not leak into logs.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The name cannot be used: it is empty, or over 4096 bytes.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name that was refused.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A lease under a millisecond (zero included) or over a year was
    /// given.
    #[error("invalid lease {lease:?}: a lease must be between 1 ms and a year (it is sent as PEXPIRE milliseconds)")]
    InvalidLease {
        /// The lease that was refused.
        lease: Duration,
    },

    /// A client setting is out of range; the message names it.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// The Redis URL could not be parsed.
    #[error("invalid Redis URL: {source}; expected redis://[user:password@]host[:port][/db]")]
    InvalidUrl {
        /// The parser's complaint.
        #[source]
        source: RedisError,
    },

    /// Redis did not answer: connection refused, reset, or no reply within the
    /// I/O timeout.
    #[error("Redis at {addr} is unreachable ({detail}); check that it is running and reachable, or raise io_timeout")]
    Unreachable {
        /// `host:port` of the server (never the password).
        addr: String,
        /// What the connection reported.
        detail: String,
        /// Whether the failure was a timeout rather than a refusal or reset.
        timed_out: bool,
        /// The transport error, when there was one (a pool that could not
        /// open a connection in time may have none).
        #[source]
        source: Option<RedisError>,
    },

    /// Redis answered a new connection with a refusal: too many clients
    /// (`maxclients`), a database number it does not have, ...
    #[error("Redis at {addr} refused the connection: {detail}; fix what it names (its maxclients, or the database number in the URL)")]
    Refused {
        /// `host:port` of the server.
        addr: String,
        /// What Redis answered.
        detail: String,
    },

    /// Redis answered, but cannot serve commands for now: it is running a
    /// long script (`BUSY`), loading its data (`LOADING`), or a replica or
    /// cluster is between masters (`MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`).
    /// Waiters and the watchdog ride this out like a dropped connection;
    /// it reaches the caller only when it outlasts their patience.
    #[error("Redis at {addr} cannot serve commands right now ({detail}); it should pass by itself: retry later")]
    Unavailable {
        /// `host:port` of the server.
        addr: String,
        /// What Redis answered.
        detail: String,
    },

    /// The Redis deployment is not of the kind the client was built for, or
    /// not whole: a cluster node given as one server (or the reverse), a
    /// cluster slot no master serves, sentinels that do not know the
    /// service. Or an object the deployment does not offer: a Redlock
    /// quorum (`Topology::masters`) offers the plain lock only, so the
    /// fair lock, and the calls of read-write locks, semaphores, latches
    /// and rate limiters, get this there. The message says what to change.
    #[error("Redis at {addr} {detail}")]
    WrongTopology {
        /// The server (or servers) that showed it.
        addr: String,
        /// What is wrong, and what to do.
        detail: String,
    },

    /// The server is older than redbaton needs: Redis 6.2 (or any Valkey).
    /// Found when the client's first command connection to it opens.
    #[error("Redis at {addr} is version {version}; redbaton needs Redis 6.2 or newer (ZADD ... GT, fractional BLPOP timeouts) or Valkey: upgrade the server")]
    UnsupportedServer {
        /// `host:port` of the server.
        addr: String,
        /// The version it reported.
        version: String,
    },

    /// Fewer replicas than [`replica_acks`](crate::ClientBuilder::replica_acks)
    /// asks for confirmed a write in time. The acquisition (or renewal,
    /// extend, hand-off) counts as not done: a fresh acquisition was undone
    /// at once. Transient: waiters try again within their deadline.
    #[error("only {acknowledged} of the {wanted} replica acknowledgements asked for came from Redis at {addr} within {timeout:?}; the write was treated as not done (check the replicas' links, or lower replica_acks)")]
    NotReplicated {
        /// The lock's master.
        addr: String,
        /// The acknowledgements asked for.
        wanted: u32,
        /// The acknowledgements that came.
        acknowledged: u32,
        /// How long the master waited for them.
        timeout: Duration,
    },

    /// Too few masters of a Redlock quorum answered (or granted in time) for
    /// a majority. Transient: waiters try again within their deadline.
    #[error("only {answered} of {masters} masters ({addr}) answered, and {needed} are needed for a majority: {detail}")]
    NoQuorum {
        /// Every master's address.
        addr: String,
        /// The masters that answered in time.
        answered: usize,
        /// The majority.
        needed: usize,
        /// How many masters there are.
        masters: usize,
        /// What the others reported.
        detail: String,
    },

    /// Every pooled connection stayed busy for the whole wait.
    #[error("no pooled Redis connection became free within {waited:?}; raise pool_size or shorten what runs under the pool")]
    PoolTimeout {
        /// How long the caller waited for a connection.
        waited: Duration,
    },

    /// A key the client keeps for the whole prefix (the identity counter)
    /// holds something that is not redbaton's.
    #[error("key {key:?} holds a value redbaton cannot use ({detail}): it must be an integer counter; delete it (redbaton starts a new one) or choose another key prefix")]
    DamagedKey {
        /// The key.
        key: String,
        /// What Redis reported.
        detail: String,
    },

    /// A key redbaton uses holds a value of another type: something else
    /// wrote there.
    #[error("the redbaton keys of {name:?} hold a value of the wrong type ({detail}); delete the key or choose another key prefix")]
    WrongType {
        /// The lock name whose keys are damaged.
        name: String,
        /// What Redis reported.
        detail: String,
    },

    /// A `#[redbaton::locked]` function did not run because another thread
    /// or process held its lock: at once (the default, one attempt), or
    /// until its `wait` ran out. The lock API itself never returns this: its
    /// `try_lock*` answer `Ok(None)`.
    #[error("lock {name:?} is held by another thread or process, so the locked function did not run; call it again later, or let it wait for the lock (`wait = \"5s\"` on `#[redbaton::locked]`)")]
    Busy {
        /// The lock name (the function's key; with `keys = [ … ]`, the
        /// multi-lock's names joined by `", "`).
        name: String,
    },

    /// The guard's lock is no longer this thread's: its lease ran out (a
    /// fixed lease, or renewal failed), or it was force-unlocked, and perhaps
    /// another holder has it now. A release in this state is refused and
    /// changes nothing in Redis.
    #[error("lock {name:?} was lost: this thread no longer owns it (its lease ran out or it was force-unlocked), so its critical section may have overlapped another holder's; use fencing tokens, or a longer lease")]
    LockLost {
        /// The lock name.
        name: String,
    },

    /// The Redis user may not run a command or touch a key that redbaton
    /// needs (an ACL refused it).
    #[error("the Redis user is not allowed to do what redbaton needs ({detail}); grant the commands and keys of the ACL line in redbaton's docs/security.md")]
    PermissionDenied {
        /// What Redis refused.
        detail: String,
    },

    /// Redis refused the credentials in the URL.
    #[error("Redis at {addr} refused the credentials ({detail}); check the user and password in the URL")]
    AuthenticationFailed {
        /// `host:port` of the server.
        addr: String,
        /// What Redis reported (never the password).
        detail: String,
        /// Redis's refusal.
        #[source]
        source: Option<RedisError>,
    },

    /// A rate limiter or semaphore was asked for zero permits, or a
    /// semaphore set to more permits than it can count.
    #[error("invalid permit count {permits}: ask for at least 1 permit (a semaphore holds at most 10^12)")]
    InvalidPermits {
        /// The count that was refused.
        permits: u64,
    },

    /// A rate limiter or semaphore was asked for more permits at once than
    /// it can ever hold, so waiting would never end.
    #[error("{name:?} can never grant {permits} permits at once: it holds at most {capacity} (a rate limiter: the permits of its rate; a semaphore: its total); ask for fewer, or raise it (a rate limiter's with force_rate, a semaphore's with add_permits)")]
    PermitsOverCapacity {
        /// The limiter's or semaphore's name.
        name: String,
        /// How many permits were asked for.
        permits: u64,
        /// The most it holds: a rate's permits per interval, or a
        /// semaphore's total.
        capacity: u64,
    },

    /// A semaphore was used before anyone set its permits.
    #[error("semaphore {name:?} has no permits: call try_set_permits on it before acquiring")]
    SemaphoreNotSet {
        /// The semaphore's name.
        name: String,
    },

    /// Permits were released after their lease had ended: they had already
    /// returned to the semaphore (counted once), so the work done under
    /// them may have overlapped other holders'.
    #[error("semaphore {name:?}: {permits} permit(s) had expired before their release (their lease ran out), so other holders may have had them meanwhile; use a longer lease, or the watchdog's renewal")]
    PermitsLost {
        /// The semaphore's name.
        name: String,
        /// How many of the released permits had expired.
        permits: u64,
    },

    /// A count-down latch was given a count of zero, or one too large to
    /// count exactly.
    #[error("invalid latch count {count}: a count-down latch starts at 1 to 2^53 (a count of 0 would be open already)")]
    InvalidCount {
        /// The count that was refused.
        count: u64,
    },

    /// A thread holding only a read lock asked for the write lock (or the
    /// upgradable read) of the same read-write lock: waiting would deadlock
    /// (two such threads would each wait for the other's read lock). To
    /// read and maybe write later, take the upgradable read instead.
    #[error("read-write lock {name:?}: this thread holds it for reading and asked to write (or for the upgradable read); release the read guards first, or take the upgradable read instead of the read")]
    UpgradeRefused {
        /// The lock's name.
        name: String,
    },

    /// A rate given to `set_rate` or `force_rate` is out of range.
    #[error("invalid rate of {permits} permits per {per:?}: {reason}")]
    InvalidRate {
        /// The permits per interval that were given.
        permits: u64,
        /// The interval that was given.
        per: Duration,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A rate limiter was used before anyone configured its rate (or after
    /// it was deleted).
    #[error(
        "rate limiter {name:?} has no rate: call set_rate (or force_rate) on it before acquiring"
    )]
    RateNotConfigured {
        /// The limiter's name.
        name: String,
    },

    /// The client was made in another process: this one is a child forked
    /// from it. Its connections and the locks its threads hold belong to
    /// the parent, so the child may not use them (it could "re-enter" a
    /// lock its parent holds, or release it).
    #[error("this client was made in process {parent} and cannot be used in process {current}, a forked child: its connections and held locks belong to the parent; make a new client in the child")]
    ForkedProcess {
        /// The process that made the client.
        parent: u32,
        /// The calling process.
        current: u32,
    },

    /// Redis answered with an error not covered above (an `ERR` reply that
    /// no other variant names, say). ACL refusals are
    /// [`Error::PermissionDenied`], and `READONLY` from a replica is
    /// [`Error::Unavailable`].
    #[error("Redis refused the command: {source}")]
    Redis {
        /// The server's reply.
        #[source]
        source: RedisError,
    },
}

impl Error {
    /// True when the failure is a timeout: no reply within the I/O timeout, or
    /// no pooled connection within the pool wait.
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::PoolTimeout { .. } => true,
            Error::Unreachable { timed_out, .. } => *timed_out,
            _ => false,
        }
    }

    /// True when Redis could not be reached at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable { .. })
    }

    /// True when the failure may pass by itself, so that the same call may
    /// succeed later: Redis could not be reached, or answered that it
    /// cannot serve commands for now ([`Error::Unavailable`]), or its
    /// replicas did not confirm a write in time ([`Error::NotReplicated`]).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unreachable { .. }
                | Error::Unavailable { .. }
                | Error::NotReplicated { .. }
                | Error::NoQuorum { .. }
        )
    }

    /// True when a `#[redbaton::locked]` function did not run because its
    /// lock was held by someone else ([`Error::Busy`]). Not counted as
    /// [`is_transient`](Error::is_transient), which is about Redis failing:
    /// contention is the lock working.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// True when a hold was lost: a lock this thread no longer owns
    /// ([`Error::LockLost`]), or permits that had expired before their
    /// release ([`Error::PermitsLost`]).
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. } | Error::PermitsLost { .. })
    }
}

//! An operator's look at what is held, beyond plain locks: the names of
//! every kind of synchronizer that holds something now, a read-write
//! lock's writer and readers, a semaphore's holders. Read through the key
//! layout's own code (`keys`), for a listing such as `redbaton list`; none
//! of it is for program logic (the answer may be stale as it arrives).

use std::time::Duration;

use super::{Client, SCAN_COUNT};
use crate::client_name;
use crate::error::Error;
use crate::keys::{self, Found, LockKeys, RwKeys, SemaphoreKeys};
use crate::sync::{Holder, Owner};

/// A kind of synchronizer, as [`Client::held_names`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum SyncKind {
    /// A plain lock ([`Client::lock`]), held.
    Lock,
    /// A fair lock ([`Client::fair_lock`]), held.
    FairLock,
    /// A read-write lock ([`Client::rw_lock`]), held for writing or for
    /// reading.
    RwLock,
    /// A semaphore ([`Client::semaphore`]) with permits held.
    Semaphore,
    /// A count-down latch ([`Client::count_down_latch`]) whose count is
    /// set and not yet zero.
    Latch,
}

/// Who holds a read-write lock now, from [`Client::rw_lock_holders`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RwHolders {
    /// The writer, if it is held for writing: as a lock's [`Holder`].
    pub writer: Option<Holder>,
    /// The readers, sorted by owner: each a [`Holder`] whose `depth` is
    /// its read guards and whose `fencing_token` is its read hold's token.
    pub readers: Vec<Holder>,
}

/// One holder of a semaphore's permits, from
/// [`Client::semaphore_holders`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The identity of the thread that acquired the permits.
    pub owner: Owner,
    /// How many permits it holds under this permit.
    pub permits: u64,
    /// Time left on the permit's lease.
    pub remaining_lease: Option<Duration>,
    /// The name of the holder's client, as in
    /// [`Holder::client_name`](crate::Holder::client_name).
    pub client_name: Option<String>,
}

impl Client {
    /// What holds something now, by kind and name, for names matching
    /// `pattern` (a Redis glob over the name, as in
    /// [`lock_names`](Client::lock_names)), sorted by kind then name, each
    /// once: held locks and fair locks, read-write locks held for writing
    /// or reading, semaphores with permits held, latches whose count is
    /// not zero. For an operator's listing: look each up with
    /// [`Lock::holder`](crate::Lock::holder),
    /// [`rw_lock_holders`](Client::rw_lock_holders),
    /// [`semaphore_holders`](Client::semaphore_holders) or
    /// [`CountDownLatch::count`](crate::CountDownLatch::count).
    ///
    /// One `SCAN` walk of the keyspace under the client's prefix, on the
    /// servers [`lock_names`](Client::lock_names) walks; the kinds are
    /// told apart by laying out each kind's keys for the name found.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redbaton::SyncKind;
    /// # fn main() -> Result<(), redbaton::Error> {
    /// let client = redbaton::Client::open("redis://127.0.0.1/")?;
    /// for (kind, name) in client.held_names("*")? {
    ///     if kind == SyncKind::RwLock {
    ///         let holders = client.rw_lock_holders(&name)?;
    ///         println!("{name}: {} readers", holders.readers.len());
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Redis failures (the first server that fails ends the walk).
    pub fn held_names(&self, pattern: &str) -> Result<Vec<(SyncKind, String)>, Error> {
        let prefix = &self.context.config.prefix;
        let keys = self.scan(pattern, &keys::object_scan_pattern(prefix, pattern))?;
        let mut found: Vec<(SyncKind, String)> = keys
            .iter()
            .filter_map(|key| keys::found_in(prefix, key))
            .map(|(found, name)| {
                let kind = match found {
                    Found::Lock => SyncKind::Lock,
                    Found::FairLock => SyncKind::FairLock,
                    Found::Write | Found::Readers => SyncKind::RwLock,
                    Found::SemaphoreHolders => SyncKind::Semaphore,
                    Found::LatchCount => SyncKind::Latch,
                };
                (kind, name)
            })
            .collect();
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// Who holds the read-write lock `name` now: its writer and its
    /// readers, with their client names. One script call for the writer,
    /// one atomic read of the readers, and a `GET` per holder's client
    /// name. A reader whose lease ended (a dead process's, not purged yet)
    /// is left out.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; Redis failures; [`Error::WrongType`] when
    /// a key holds something else; [`Error::WrongTopology`] on
    /// independent masters.
    pub fn rw_lock_holders(&self, name: &str) -> Result<RwHolders, Error> {
        let prefix = &self.context.config.prefix;
        let rw = RwKeys::new(prefix, name)?;
        // The write hold is stored as a lock key (flag, count, fence): the
        // lock's own read of its holder reads it.
        let as_lock = LockKeys {
            name: rw.name.clone(),
            lock: rw.write.clone(),
            baton: rw.write_baton.clone(),
            fence: rw.fence.clone(),
            fair: None,
        };
        let mut writer = self.lock_raw.holder(&as_lock)?;
        if let Some(writer) = &mut writer {
            writer.client_name = self.client_name_of(writer.owner.as_str())?;
        }
        let (now, readers, depths) = self.leases_and(&rw.readers, &rw.read_depths, name)?;
        let mut holders = Vec::with_capacity(readers.len());
        for (identity, ends) in readers {
            let Some(remaining_lease) = left(now, ends) else {
                continue;
            };
            // "<depth>:<token>"; a reader without one is mid-release.
            let Some((depth, token)) = depths
                .iter()
                .find(|(id, _)| *id == identity)
                .and_then(|(_, value)| value.split_once(':'))
                .and_then(|(depth, token)| Some((depth.parse().ok()?, token.parse().ok()?)))
            else {
                continue;
            };
            holders.push(Holder {
                client_name: self.client_name_of(&identity)?,
                owner: Owner::new(identity),
                depth,
                fencing_token: token,
                remaining_lease,
            });
        }
        holders.sort_by(|a, b| a.owner.cmp(&b.owner));
        Ok(RwHolders {
            writer,
            readers: holders,
        })
    }

    /// Who holds permits of the semaphore `name` now: one entry per permit
    /// (an acquisition, of one or more permits), sorted by owner, with
    /// the holders' client names. One atomic read, and a `GET` per
    /// holder's client name. A permit whose lease ended (a dead
    /// process's, not purged yet) is left out.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; Redis failures; [`Error::WrongType`] when
    /// a key holds something else; [`Error::WrongTopology`] on
    /// independent masters.
    pub fn semaphore_holders(&self, name: &str) -> Result<Vec<PermitHolder>, Error> {
        let sem = SemaphoreKeys::new(&self.context.config.prefix, name)?;
        let (now, permits, counts) = self.leases_and(&sem.holders, &sem.counts, name)?;
        let mut holders = Vec::with_capacity(permits.len());
        for (id, ends) in permits {
            let Some(remaining_lease) = left(now, ends) else {
                continue;
            };
            let Some(count) = counts
                .iter()
                .find(|(permit, _)| *permit == id)
                .and_then(|(_, count)| count.parse().ok())
            else {
                continue;
            };
            // A permit id is the acquiring thread's identity, then `:` and
            // a request number.
            let identity = id
                .rsplit_once(':')
                .map_or(id.as_str(), |(identity, _)| identity);
            holders.push(PermitHolder {
                client_name: self.client_name_of(identity)?,
                owner: Owner::new(identity.to_owned()),
                permits: count,
                remaining_lease,
            });
        }
        holders.sort_by(|a, b| a.owner.cmp(&b.owner));
        Ok(holders)
    }

    /// The server's time (ms), the members of the sorted set `leases`
    /// with their scores (lease ends, server ms), and the hash `values`,
    /// read in one round trip (the keys of one object share a slot). Not
    /// in a `MULTI`, which the documented ACL does not allow (and whose
    /// refusal redis-rs answers with a panic in a debug build): a hold
    /// that changes between the reads is left out of the view, or shown
    /// as it was a moment before.
    #[allow(clippy::type_complexity)]
    fn leases_and(
        &self,
        leases: &str,
        values: &str,
        name: &str,
    ) -> Result<(f64, Vec<(String, f64)>, Vec<(String, String)>), Error> {
        let ((secs, micros), members, values): (
            (u64, u64),
            Vec<(String, f64)>,
            Vec<(String, String)>,
        ) = self.context.backend.run(leases, name, |c| {
            redis::pipe()
                .cmd("TIME")
                .cmd("ZRANGE")
                .arg(leases)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("HGETALL")
                .arg(values)
                .query(c)
        })?;
        let now = secs as f64 * 1e3 + micros as f64 / 1e3;
        Ok((now, members, values))
    }

    /// The client name of the holder `identity`, when client names are
    /// kept (not on independent masters).
    fn client_name_of(&self, identity: &str) -> Result<Option<String>, Error> {
        if self.context.leases.name.is_none() {
            return Ok(None);
        }
        client_name::name_of(&self.context.backend, &self.context.config.prefix, identity)
    }

    /// The keys matching `matching` under the client's prefix, on every
    /// server that holds keys (`name`: the object named in an error).
    pub(super) fn scan(&self, name: &str, matching: &str) -> Result<Vec<String>, Error> {
        let found = self.context.backend.on_every_master(name, |c| {
            let mut keys = Vec::new();
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(matching)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query(c)?;
                keys.extend(batch);
                if next == 0 {
                    return Ok(keys);
                }
                cursor = next;
            }
        })?;
        Ok(found.into_iter().flatten().collect())
    }
}

/// The lease left at server time `now` (ms) of a hold whose lease ends at
/// `ends` (ms); `None` once it ended. An infinite end is no expiry.
fn left(now: f64, ends: f64) -> Option<Option<Duration>> {
    let left = ends - now;
    // Past what a `Duration` holds (an infinite end): no expiry.
    (left > 0.0).then(|| Duration::try_from_secs_f64(left / 1e3).ok())
}

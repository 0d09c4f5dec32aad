//! Where a lock lives in Redis.
//!
//! For prefix `P` and lock name `N`, the keys are `P:{T}:lock`, `P:{T}:baton`
//! and `P:{T}:fence`, where `T` is `N` with `%`, `{` and `}` percent-encoded.
//! Redis Cluster hashes only the part between the first `{` and the next `}`;
//! the prefix may not contain braces and the encoded name contains none, so
//! that part is always exactly `T` and the three keys of one lock always share
//! a slot, whatever characters the name holds. The encoding is reversible, so
//! two names never share keys.
//!
//! A rate limiter named `N` lives under the same tag, in its own `rate`
//! namespace: `P:{T}:rate:config`, `P:{T}:rate:overall` and
//! `P:{T}:rate:client:<uuid>`. Lock keys end in `:lock`, `:baton` or
//! `:fence` right after the tag, limiter keys in `:rate:...`, so a lock and a
//! limiter of the same name never share a key (they do share a slot, which
//! is harmless).
//!
//! The other synchronizers have namespaces of their own under the tag:
//! `fair:` (fair lock), `rw:` (read-write lock), `sem:` (semaphore) and
//! `latch:` (count-down latch), so that objects of different kinds never
//! share a key even under one name.

use crate::error::Error;
use crate::observe::HoldKind;

/// The longest lock name accepted. Redis takes longer keys, but a name this
/// long is almost surely data passed by mistake, and every command carries it.
pub(crate) const MAX_NAME_BYTES: usize = 4096;

/// Checks the name of an object of any kind (lock, rate limiter, ...): the
/// one place where names are validated.
fn check_name(name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "a name must not be empty"
    } else if name.len() > MAX_NAME_BYTES {
        "a name must be at most 4096 bytes"
    } else {
        return Ok(());
    };
    let shown: String = name.chars().take(32).collect();
    Err(Error::InvalidName {
        name: if shown.len() < name.len() {
            shown + "..."
        } else {
            shown
        },
        reason,
    })
}

/// `P:{T}`: the start of every key of object `name`, where `T` is its hash
/// tag.
fn tagged(prefix: &str, name: &str) -> String {
    format!("{prefix}:{{{}}}", hash_tag(name))
}

/// The three keys of one lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The name the user gave.
    pub(crate) name: String,
    /// Hash: `flag` (owner identity), `count` (depth), `fence` (token).
    pub(crate) lock: String,
    /// List: at most one `"ok"` token for a waiter.
    pub(crate) baton: String,
    /// String: the per-lock fencing counter.
    pub(crate) fence: String,
    /// A fair lock's queue keys (`None` for the plain lock); `baton` is
    /// then the prefix of each waiter's own list.
    pub(crate) fair: Option<FairKeys>,
}

/// The fair lock's queue of waiters, beside its lock key. Every script
/// that reads or writes them names them in its KEYS (Redis Cluster routes
/// and checks scripts by their declared keys only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FairKeys {
    /// Sorted set: waiter identity, scored by its arrival (server µs).
    pub(crate) queue: String,
    /// Sorted set: waiter identity, scored by when its place ends unless
    /// it comes back (server ms).
    pub(crate) places: String,
    /// List: the head's list. The head of the queue parks here while the
    /// lock is held, so that a release, which names this key, wakes it
    /// without a second call (see `fair/acquire.lua`).
    pub(crate) next: String,
}

impl LockKeys {
    /// The list a fair lock's waiter `identity` parks on, and which a
    /// release pushes when that waiter is the head of the queue. Shares
    /// the lock's hash tag, so a release names it in its KEYS: where the
    /// ownership's acquisition found that waiter first in the queue, else
    /// in a second call, once the first told it whom to wake.
    pub(crate) fn wake_list(&self, identity: &str) -> String {
        format!("{}:{identity}", self.baton)
    }

    /// Where a fair lock's waiter `identity` keeps what a release may
    /// grant it (`fair/acquire.lua` writes it while the waiter keeps its
    /// place; `fair/release.lua` reads the guessed head's): shares the
    /// lock's hash tag, like its list.
    pub(crate) fn grant_spec(&self, identity: &str) -> String {
        format!("{}:grant:{identity}", self.lock)
    }
}

impl LockKeys {
    /// Lays out the keys of `name` under `prefix` (already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Self, Error> {
        check_name(name)?;
        let tagged = tagged(prefix, name);
        Ok(LockKeys {
            name: name.to_owned(),
            lock: format!("{tagged}:lock"),
            baton: format!("{tagged}:baton"),
            fence: format!("{tagged}:fence"),
            fair: None,
        })
    }
}

impl LockKeys {
    /// The keys of the fair lock `name`: a lock key, a fence and, per
    /// waiter, a list of its own under `baton` (`<baton>:<identity>`),
    /// next to the queue of waiters (`<lock>:queue`, arrival order) and
    /// their places' deadlines (`<lock>:places`).
    pub(crate) fn fair(prefix: &str, name: &str) -> Result<Self, Error> {
        check_name(name)?;
        let tagged = tagged(prefix, name);
        let lock = format!("{tagged}:fair:lock");
        Ok(LockKeys {
            name: name.to_owned(),
            baton: format!("{tagged}:fair:wake"),
            fence: format!("{tagged}:fair:fence"),
            fair: Some(FairKeys {
                queue: format!("{lock}:queue"),
                places: format!("{lock}:places"),
                next: format!("{lock}:next"),
            }),
            lock,
        })
    }
}

/// The keys of one read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwKeys {
    /// The name the user gave.
    pub(crate) name: String,
    /// Hash: the writer, as a lock key (`flag`, `count`, `fence`), with the
    /// write lease as TTL.
    pub(crate) write: String,
    /// Sorted set: reader identity → end of its lease (server ms).
    pub(crate) readers: String,
    /// Hash: reader identity → `<depth>:<token>` of its read hold.
    pub(crate) read_depths: String,
    /// Sorted set: waiting writer → end of its place (server ms), renewed
    /// at each of its attempts; while one lives, new readers wait.
    pub(crate) waiting_writers: String,
    /// List: batons for waiting readers.
    pub(crate) read_baton: String,
    /// List: batons for waiting writers.
    pub(crate) write_baton: String,
    /// String: the fencing counter of write ownerships.
    pub(crate) fence: String,
    /// Hash: the upgradable reader, as a lock key (`flag`, `count`,
    /// `fence` = its hold's token, `req`), with its lease as TTL;
    /// `upgrading` = the end of a waiting upgrade's mark (server ms).
    pub(crate) upgradable: String,
    /// List: batons for threads waiting for the upgradable read.
    pub(crate) upgradable_baton: String,
    /// List: the baton of the upgradable holder waiting to upgrade.
    pub(crate) upgrade_baton: String,
    /// Hash: waiting reader identity → `<request> <grant lease ms>`, the
    /// spec a writer's release grants it the read by (where grants come).
    pub(crate) read_grants: String,
    /// Hash: waiting writer identity → `<request> <grant lease ms>`, the
    /// spec a release grants it the write hold by (where grants come).
    pub(crate) write_grants: String,
}

impl RwKeys {
    /// Lays out the keys of read-write lock `name` under `prefix`.
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Self, Error> {
        check_name(name)?;
        let rw = format!("{}:rw", tagged(prefix, name));
        Ok(RwKeys {
            name: name.to_owned(),
            write: format!("{rw}:write"),
            readers: format!("{rw}:readers"),
            read_depths: format!("{rw}:depths"),
            waiting_writers: format!("{rw}:writers"),
            read_baton: format!("{rw}:rbaton"),
            write_baton: format!("{rw}:wbaton"),
            fence: format!("{rw}:fence"),
            upgradable: format!("{rw}:upgradable"),
            upgradable_baton: format!("{rw}:ubaton"),
            upgrade_baton: format!("{rw}:upbaton"),
            read_grants: format!("{rw}:rgrants"),
            write_grants: format!("{rw}:wgrants"),
        })
    }

    /// The depths key beside the readers key `readers` (what the watchdog
    /// knows of a read hold is the key its lease lives on).
    pub(crate) fn depths_beside(readers: &str) -> Option<String> {
        readers
            .strip_suffix(":rw:readers")
            .map(|tagged| format!("{tagged}:rw:depths"))
    }
}

/// The keys of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SemaphoreKeys {
    /// The name the user gave.
    pub(crate) name: String,
    /// Hash: `total` (permits in force), `used` (held by live permits).
    pub(crate) state: String,
    /// Sorted set: permit id → end of its lease (server ms).
    pub(crate) holders: String,
    /// Hash: permit id → how many permits it holds.
    pub(crate) counts: String,
    /// Sorted set: `<k>:<waiting identity>` (a waiter and the permits it
    /// wants) → end of its place (server ms).
    pub(crate) waiters: String,
    /// List: batons, one per permit released, up to the number waiting.
    pub(crate) baton: String,
    /// List: the baton of the waiter that holds newcomers back (the
    /// reservation), pushed when the permits it needs are free. Its own
    /// list, so that no waiter that cannot use it pops it first.
    pub(crate) reserved_baton: String,
    /// Sorted set: the ids of recent adds and reductions → when each is
    /// forgotten (server ms), so that one sent twice is applied once.
    pub(crate) adjusted: String,
    /// Hash: a waiter's place → its grant spec (see `lib/permits.lua`),
    /// where the deployment allows grants.
    pub(crate) grant_specs: String,
}

impl SemaphoreKeys {
    /// Lays out the keys of semaphore `name` under `prefix`.
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Self, Error> {
        check_name(name)?;
        let sem = format!("{}:sem", tagged(prefix, name));
        Ok(SemaphoreKeys {
            name: name.to_owned(),
            state: format!("{sem}:state"),
            holders: format!("{sem}:holders"),
            counts: format!("{sem}:counts"),
            waiters: format!("{sem}:waiters"),
            baton: format!("{sem}:baton"),
            reserved_baton: format!("{sem}:rbaton"),
            adjusted: format!("{sem}:adjusted"),
            grant_specs: format!("{sem}:grants"),
        })
    }
}

/// The keys of one count-down latch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LatchKeys {
    /// The name the user gave.
    pub(crate) name: String,
    /// String: the count.
    pub(crate) count: String,
    /// String: the id of the current round (of the last one, with a TTL,
    /// once it ended).
    pub(crate) round: String,
    /// What the baton key of a round starts with; see [`LatchKeys::baton`].
    baton_prefix: String,
    /// Set: the ids of this round's count-downs, so that one sent twice
    /// counts once.
    pub(crate) applied: String,
}

impl LatchKeys {
    /// Lays out the keys of latch `name` under `prefix`.
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Self, Error> {
        check_name(name)?;
        let latch = format!("{}:latch", tagged(prefix, name));
        Ok(LatchKeys {
            name: name.to_owned(),
            count: format!("{latch}:count"),
            round: format!("{latch}:round"),
            baton_prefix: format!("{latch}:baton:"),
            applied: format!("{latch}:applied"),
        })
    }

    /// List: the token that wakes the waiters of round `round` once it
    /// ended, each passing it on. One per round, so that starting the next
    /// round cannot take the token from waiters of the last one.
    pub(crate) fn baton(&self, round: &str) -> String {
        format!("{}{round}", self.baton_prefix)
    }
}

/// The keys of one rate limiter, as seen by one client instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LimiterKeys {
    /// The name the user gave.
    pub(crate) name: String,
    /// Hash: `mode`, `permits`, `per_us`. No TTL.
    pub(crate) config: String,
    /// Hash: `tokens`, `ts`: the bucket every client shares in overall mode.
    pub(crate) overall: String,
    /// Hash: `tokens`, `ts`: this client instance's bucket in per-client mode.
    pub(crate) per_client: String,
}

impl LimiterKeys {
    /// Lays out the keys of limiter `name` under `prefix` (already
    /// validated), for the client instance `instance`.
    pub(crate) fn new(prefix: &str, name: &str, instance: uuid::Uuid) -> Result<Self, Error> {
        check_name(name)?;
        let tagged = tagged(prefix, name);
        Ok(LimiterKeys {
            name: name.to_owned(),
            config: format!("{tagged}:rate:config"),
            overall: format!("{tagged}:rate:overall"),
            per_client: format!("{tagged}:rate:client:{instance}"),
        })
    }
}

/// What a waiter on `baton_key` (for object `name` under `prefix`) waits
/// for: the kind of hold whose baton (or fair lock's wake list) it is, or
/// `None` for a latch's round (not a hold) or a key of no hold. Read back
/// by laying out each kind's keys for `name`, so that the layout has one
/// copy; the wait core asks only when an event hook is set.
pub(crate) fn kind_waited_on(prefix: &str, name: &str, baton_key: &str) -> Option<HoldKind> {
    if LockKeys::new(prefix, name).ok()?.baton == baton_key {
        return Some(HoldKind::Lock);
    }
    let fair = LockKeys::fair(prefix, name).ok()?;
    let own_list = baton_key
        .strip_prefix(fair.baton.as_str())
        .is_some_and(|rest| rest.starts_with(':'));
    if own_list || fair.fair.is_some_and(|queue| queue.next == baton_key) {
        return Some(HoldKind::FairLock);
    }
    let rw = RwKeys::new(prefix, name).ok()?;
    if rw.read_baton == baton_key {
        return Some(HoldKind::Read);
    }
    if rw.write_baton == baton_key || rw.upgrade_baton == baton_key {
        return Some(HoldKind::Write);
    }
    if rw.upgradable_baton == baton_key {
        return Some(HoldKind::Upgradable);
    }
    let sem = SemaphoreKeys::new(prefix, name).ok()?;
    if sem.baton == baton_key || sem.reserved_baton == baton_key {
        return Some(HoldKind::Permits);
    }
    None
}

/// What the key `key` under `prefix` shows is held, for an operator's
/// listing: a held lock's, fair lock's, write hold's or read holds' key, a
/// semaphore's holders, a latch's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// `LockKeys::new(..).lock`.
    Lock,
    /// `LockKeys::fair(..).lock`.
    FairLock,
    /// `RwKeys::write`.
    Write,
    /// `RwKeys::readers`.
    Readers,
    /// `SemaphoreKeys::holders`.
    SemaphoreHolders,
    /// `LatchKeys::count`.
    LatchCount,
}

/// The `SCAN MATCH` pattern of every key under `prefix` of the objects
/// whose names match `name_glob` (encoded and escaped as in
/// [`lock_scan_pattern`]): `P:{G}:*`.
pub(crate) fn object_scan_pattern(prefix: &str, name_glob: &str) -> String {
    format!("{}:{{{}}}:*", glob_escape(prefix), hash_tag(name_glob))
}

/// The object name in `key` under `prefix`, and what the key shows held
/// ([`Found`]); `None` for any other key (a baton, a fence, a rate
/// limiter's, another prefix's, an encoding [`hash_tag`] never makes).
/// Read back by laying out each kind's keys for the name found, so that
/// the layout has one copy.
pub(crate) fn found_in(prefix: &str, key: &str) -> Option<(Found, String)> {
    let (tag, _) = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .split_once('}')?;
    let name = untag(tag)?;
    check_name(&name).ok()?;
    let found = if LockKeys::new(prefix, &name).ok()?.lock == key {
        Found::Lock
    } else if LockKeys::fair(prefix, &name).ok()?.lock == key {
        Found::FairLock
    } else if let Some(rw) = RwKeys::new(prefix, &name)
        .ok()
        .filter(|rw| rw.write == key || rw.readers == key)
    {
        if rw.write == key {
            Found::Write
        } else {
            Found::Readers
        }
    } else if SemaphoreKeys::new(prefix, &name).ok()?.holders == key {
        Found::SemaphoreHolders
    } else if LatchKeys::new(prefix, &name).ok()?.count == key {
        Found::LatchCount
    } else {
        return None;
    };
    Some((found, name))
}

/// The `SCAN MATCH` pattern of the lock keys under `prefix` whose names
/// match `name_glob`: `P:{G}:lock`, where `G` is the glob with `%`, `{` and
/// `}` encoded as in a key, so that a literal brace in it matches a brace
/// of a name. The prefix's glob characters are escaped: it is matched
/// literally. A name's `%`, `{` and `}` take three characters in a key, so
/// a `?` of the glob never matches one of them (a `*` does).
pub(crate) fn lock_scan_pattern(prefix: &str, name_glob: &str) -> String {
    format!("{}:{{{}}}:lock", glob_escape(prefix), hash_tag(name_glob))
}

/// The name of the plain lock whose lock key is `key` under `prefix`, or
/// `None` when `key` is no such key (another kind's, another prefix's, or
/// an encoding [`hash_tag`] never makes). The inverse of
/// [`LockKeys::new`]'s `lock`.
pub(crate) fn lock_name_of(prefix: &str, key: &str) -> Option<String> {
    let tag = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix("}:lock")?;
    let name = untag(tag)?;
    check_name(&name).ok()?;
    Some(name)
}

/// The keys of the lock, plain or fair, whose lock key is `key` under
/// `prefix`, or `None` when `key` is neither's.
pub(crate) fn lock_keys_of(prefix: &str, key: &str) -> Option<LockKeys> {
    if let Some(name) = lock_name_of(prefix, key) {
        return LockKeys::new(prefix, &name).ok();
    }
    let tag = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix("}:fair:lock")?;
    let name = untag(tag)?;
    LockKeys::fair(prefix, &name).ok()
}

/// The keys of the semaphore whose state key is `key` under `prefix`, or
/// `None` when `key` is no such key. The inverse of [`SemaphoreKeys::new`]'s
/// `state`.
pub(crate) fn semaphore_keys_of(prefix: &str, key: &str) -> Option<SemaphoreKeys> {
    let tag = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix("}:sem:state")?;
    SemaphoreKeys::new(prefix, &untag(tag)?).ok()
}

/// The keys of the read-write lock whose write key is `key`, under
/// `prefix`, if it is one.
pub(crate) fn rwlock_keys_of(prefix: &str, key: &str) -> Option<RwKeys> {
    let tag = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix("}:rw:write")?;
    RwKeys::new(prefix, &untag(tag)?).ok()
}

/// Undoes [`hash_tag`]: `None` for a tag it cannot have made (a brace, or
/// a `%` not followed by one of its three codes).
fn untag(tag: &str) -> Option<String> {
    let mut name = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(at) = rest.find(['%', '{', '}']) {
        name.push_str(&rest[..at]);
        let code = rest[at..].get(..3)?;
        name.push(match code {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    name.push_str(rest);
    Some(name)
}

/// `text` with the characters special to Redis's glob (`*`, `?`, `[`, `]`,
/// `\`) escaped, so that it matches itself only.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The key of the `INCR` counter that numbers thread identities.
pub(crate) fn identity_counter(prefix: &str) -> String {
    format!("{prefix}:identity")
}

/// Percent-encodes the three characters that could end the hash tag early or
/// make the encoding ambiguous. Everything else (colons, spaces, NUL, emoji)
/// is kept as is, so keys stay readable in `redis-cli`.
fn hash_tag(name: &str) -> String {
    let mut tag = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => tag.push_str("%25"),
            '{' => tag.push_str("%7B"),
            '}' => tag.push_str("%7D"),
            c => tag.push(c),
        }
    }
    tag
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_brace_free_hash_tag() {
        let keys = LockKeys::new("redbaton", "a{b}c%d").unwrap();
        assert_eq!(keys.lock, "redbaton:{a%7Bb%7Dc%25d}:lock");
        assert_eq!(keys.baton, "redbaton:{a%7Bb%7Dc%25d}:baton");
        assert_eq!(keys.fence, "redbaton:{a%7Bb%7Dc%25d}:fence");
    }

    #[test]
    fn encoding_keeps_distinct_names_apart() {
        let a = LockKeys::new("p", "{x}").unwrap();
        let b = LockKeys::new("p", "%7Bx%7D").unwrap();
        assert_ne!(a.lock, b.lock);
    }

    #[test]
    fn limiter_keys_share_the_tag_but_never_a_lock_key() {
        let instance = uuid::Uuid::nil();
        let keys = LimiterKeys::new("redbaton", "api{x}", instance).unwrap();
        assert_eq!(keys.config, "redbaton:{api%7Bx%7D}:rate:config");
        assert_eq!(keys.overall, "redbaton:{api%7Bx%7D}:rate:overall");
        assert_eq!(
            keys.per_client,
            format!("redbaton:{{api%7Bx%7D}}:rate:client:{instance}")
        );
        let lock = LockKeys::new("redbaton", "api{x}").unwrap();
        for key in [&keys.config, &keys.overall, &keys.per_client] {
            assert!(![&lock.lock, &lock.baton, &lock.fence].contains(&key));
        }
        assert!(matches!(
            LimiterKeys::new("p", "", instance),
            Err(Error::InvalidName { .. })
        ));
    }

    #[test]
    fn kinds_never_share_a_key_under_one_name() {
        let name = "shared";
        let lock = LockKeys::new("p", name).unwrap();
        let fair = LockKeys::fair("p", name).unwrap();
        let rw = RwKeys::new("p", name).unwrap();
        assert_eq!(
            RwKeys::depths_beside(&rw.readers).as_deref(),
            Some(rw.read_depths.as_str())
        );
        let sem = SemaphoreKeys::new("p", name).unwrap();
        let latch = LatchKeys::new("p", name).unwrap();
        let mut all = vec![
            lock.lock,
            lock.baton,
            lock.fence,
            fair.lock.clone(),
            fair.wake_list("a:1"),
            fair.fence.clone(),
            fair.fair.clone().unwrap().queue,
            fair.fair.clone().unwrap().places,
            fair.fair.unwrap().next,
            rw.write,
            rw.readers,
            rw.read_depths,
            rw.waiting_writers,
            rw.read_baton,
            rw.write_baton,
            rw.fence,
            rw.upgradable,
            rw.upgradable_baton,
            rw.upgrade_baton,
            rw.read_grants,
            rw.write_grants,
            sem.state,
            sem.holders,
            sem.counts,
            sem.waiters,
            sem.baton,
            sem.reserved_baton,
            sem.adjusted,
            latch.baton("r"),
            latch.count,
            latch.round,
            latch.applied,
        ];
        assert!(all.iter().all(|key| key.starts_with("p:{shared}:")));
        let count = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), count);
    }

    #[test]
    fn empty_and_overlong_names_are_refused_for_every_kind() {
        assert!(matches!(
            LockKeys::new("p", ""),
            Err(Error::InvalidName { .. })
        ));
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let instance = uuid::Uuid::nil();
        assert!(matches!(
            LimiterKeys::new("p", &long, instance),
            Err(Error::InvalidName { .. })
        ));
        assert!(LockKeys::new("p", &long[1..]).is_ok());
    }

    #[test]
    fn lock_names_are_read_back_from_their_keys() {
        for name in ["plain", "a{b}c%d", "%7B", "}{", "x:lock", "émoji 🦀", "%"] {
            let keys = LockKeys::new("app:p", name).unwrap();
            assert_eq!(lock_name_of("app:p", &keys.lock).as_deref(), Some(name));
        }
        // Another kind's key, another prefix's, a key of no lock.
        let fair = LockKeys::fair("p", "n").unwrap();
        assert_eq!(lock_name_of("p", &fair.lock), None);
        assert_eq!(
            lock_name_of("p", &LockKeys::new("p", "n").unwrap().baton),
            None
        );
        assert_eq!(
            lock_name_of("q", &LockKeys::new("p", "n").unwrap().lock),
            None
        );
        assert_eq!(lock_name_of("p", "p:{}:lock"), None);
        // Encodings the key layout never makes.
        for key in [
            "p:{a%41}:lock",
            "p:{a%7}:lock",
            "p:{a%}:lock",
            "p:{a{b}:lock",
            "p:{a}b}:lock",
        ] {
            assert_eq!(lock_name_of("p", key), None, "{key}");
        }
    }

    #[test]
    fn the_keys_of_a_plain_or_fair_lock_are_read_back_from_its_lock_key() {
        for name in ["plain", "a{b}c%d", "x:fair", "%"] {
            let plain = LockKeys::new("p", name).unwrap();
            assert_eq!(lock_keys_of("p", &plain.lock), Some(plain));
            let fair = LockKeys::fair("p", name).unwrap();
            assert_eq!(lock_keys_of("p", &fair.lock), Some(fair));
        }
        let fair = LockKeys::fair("p", "n").unwrap();
        assert_eq!(lock_keys_of("p", &fair.baton), None);
        assert_eq!(lock_keys_of("q", &fair.lock), None);
        assert_eq!(lock_keys_of("p", "p:{a}b}:fair:lock"), None);
    }

    #[test]
    fn the_keys_of_a_semaphore_are_read_back_from_its_state_key() {
        for name in ["plain", "a{b}c%d", "x:sem", "%"] {
            let keys = SemaphoreKeys::new("p", name).unwrap();
            assert_eq!(semaphore_keys_of("p", &keys.state), Some(keys));
        }
        let keys = SemaphoreKeys::new("p", "n").unwrap();
        assert_eq!(semaphore_keys_of("p", &keys.holders), None);
        assert_eq!(semaphore_keys_of("q", &keys.state), None);
        assert_eq!(semaphore_keys_of("p", "p:{a}b}:sem:state"), None);
        let lock = LockKeys::new("p", "n").unwrap();
        assert_eq!(semaphore_keys_of("p", &lock.lock), None);
    }

    #[test]
    fn the_keys_of_a_read_write_lock_are_read_back_from_its_write_key() {
        for name in ["plain", "a{b}c%d", "x:rw", "%"] {
            let keys = RwKeys::new("p", name).unwrap();
            assert_eq!(rwlock_keys_of("p", &keys.write), Some(keys));
        }
        let keys = RwKeys::new("p", "n").unwrap();
        assert_eq!(rwlock_keys_of("p", &keys.readers), None);
        assert_eq!(rwlock_keys_of("q", &keys.write), None);
        assert_eq!(rwlock_keys_of("p", "p:{a}b}:rw:write"), None);
        let sem = SemaphoreKeys::new("p", "n").unwrap();
        assert_eq!(rwlock_keys_of("p", &sem.state), None);
    }

    #[test]
    fn a_baton_key_tells_what_its_waiters_wait_for() {
        let name = "a{b}:baton";
        let lock = LockKeys::new("p", name).unwrap();
        let fair = LockKeys::fair("p", name).unwrap();
        let rw = RwKeys::new("p", name).unwrap();
        let sem = SemaphoreKeys::new("p", name).unwrap();
        let latch = LatchKeys::new("p", name).unwrap();
        for (key, kind) in [
            (lock.baton.clone(), Some(HoldKind::Lock)),
            (fair.wake_list("i:1"), Some(HoldKind::FairLock)),
            (fair.fair.clone().unwrap().next, Some(HoldKind::FairLock)),
            (rw.read_baton, Some(HoldKind::Read)),
            (rw.write_baton, Some(HoldKind::Write)),
            (rw.upgrade_baton, Some(HoldKind::Write)),
            (rw.upgradable_baton, Some(HoldKind::Upgradable)),
            (sem.baton, Some(HoldKind::Permits)),
            (sem.reserved_baton, Some(HoldKind::Permits)),
            (latch.baton("r"), None),
            // Not batons, or another name's.
            (fair.baton, None),
            (lock.lock, None),
            (LockKeys::new("p", "other").unwrap().baton, None),
        ] {
            assert_eq!(kind_waited_on("p", name, &key), kind, "{key}");
        }
    }

    #[test]
    fn held_objects_are_read_back_from_their_keys() {
        for name in ["plain", "a{b}c%d", "x:rw:write", "émoji 🦀"] {
            let lock = LockKeys::new("app:p", name).unwrap();
            let fair = LockKeys::fair("app:p", name).unwrap();
            let rw = RwKeys::new("app:p", name).unwrap();
            let sem = SemaphoreKeys::new("app:p", name).unwrap();
            let latch = LatchKeys::new("app:p", name).unwrap();
            for (key, found) in [
                (&lock.lock, Found::Lock),
                (&fair.lock, Found::FairLock),
                (&rw.write, Found::Write),
                (&rw.readers, Found::Readers),
                (&sem.holders, Found::SemaphoreHolders),
                (&latch.count, Found::LatchCount),
            ] {
                assert_eq!(
                    found_in("app:p", key),
                    Some((found, name.to_owned())),
                    "{key}"
                );
            }
            // Keys that show nothing held, and another prefix's.
            for key in [&lock.baton, &lock.fence, &fair.fence, &rw.fence, &sem.state] {
                assert_eq!(found_in("app:p", key), None, "{key}");
            }
            assert_eq!(found_in("app", &lock.lock), None);
        }
        assert_eq!(found_in("p", "p:{a%41}:lock"), None);
        assert_eq!(object_scan_pattern("a*", "job{1}*"), "a\\*:{job%7B1%7D*}:*");
    }

    #[test]
    fn scan_patterns_encode_the_glob_and_escape_the_prefix() {
        assert_eq!(lock_scan_pattern("redbaton", "*"), "redbaton:{*}:lock");
        assert_eq!(
            lock_scan_pattern("redbaton", "job{1}*"),
            "redbaton:{job%7B1%7D*}:lock"
        );
        assert_eq!(
            lock_scan_pattern("a*b?[c]\\", "%"),
            "a\\*b\\?\\[c\\]\\\\:{%25}:lock"
        );
    }
}

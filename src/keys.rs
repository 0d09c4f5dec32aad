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

use crate::error::Error;

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
        })
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
}

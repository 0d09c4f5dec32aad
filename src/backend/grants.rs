//! Grants: where a release hands what it frees to a parked waiter of
//! another process itself, and tells that waiter's client on the client's
//! own channel, instead of waking the waiter to try again. The parking hub
//! of the server (`hub`) subscribes to the channel while anyone waits
//! there, and ends the park of the waiter a message names with the token
//! it was granted ([`Parked::Granted`](super::Parked)).
//!
//! This module knows the channel and the message, not what is granted: a
//! message names the waiter by its *ticket* (the owner it was granted to
//! and the request its park follows, as the waiter gave it to its park:
//! [`ParkHow::ticket`](super::ParkHow)), the token, the key of what was
//! granted and the list the waiter parks on. A message whose waiter is no
//! longer parked (it stopped waiting, or parks after a later request) is
//! given back, through what the client's synchronizer installed
//! ([`Grants::give_back_with`]), on a thread of the hub's (`give_backs`).
//!
//! Only where one server's word is final: one server, and Sentinel's
//! master without replica acknowledgements. A Cluster node's publish
//! reaches its own subscribers only, a quorum's grant would be one
//! master's, and a grant the replicas did not confirm could be lost to a
//! failover after its waiter began to use it.

use std::fmt;
use std::sync::OnceLock;

use super::GrantReceipt;

/// What the client's synchronizer sends on a connection to the server
/// that granted it to give back a grant nobody parked took. It holds no
/// handle on the client: the hub's give-back thread (`give_backs`) gives
/// grants back even while the client is being dropped, every grant its
/// listener heard until it unsubscribed.
pub(crate) type GiveBack = Box<
    dyn Fn(&mut dyn redis::ConnectionLike, Unclaimed<'_>) -> redis::RedisResult<()> + Send + Sync,
>;

/// A grant that found no parked waiter: the ownership of `key` written for
/// `owner` under `token`, to be released.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unclaimed<'a> {
    pub(crate) owner: &'a str,
    /// The request of `owner`'s the grant followed.
    pub(crate) request: &'a str,
    pub(crate) token: u64,
    /// What was passed along with it (see [`GrantReceipt::behind`]).
    pub(crate) behind: &'a str,
    pub(crate) key: &'a str,
}

/// One client's grant channel, and what gives back the grants nobody took.
pub(crate) struct Grants {
    /// The channel this client's grants come on.
    channel: String,
    /// The channels' prefix, which the scripts complete with the client's
    /// id (the part of an owner's identity before its `:`).
    prefix: String,
    give_back: OnceLock<GiveBack>,
}

/// One grant as its message gives it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Granted {
    /// The owner and the request it names, as the waiter's ticket.
    pub(super) ticket: String,
    /// The owner alone.
    owner_len: usize,
    pub(super) token: u64,
    /// What was passed along with it (see [`GrantReceipt::behind`]).
    behind: String,
    /// The key of what was granted.
    pub(super) key: String,
    /// The list its waiter parks on.
    pub(super) list: String,
}

impl Grants {
    /// The grants of the client `instance` under the key prefix `prefix`.
    pub(crate) fn new(prefix: &str, instance: &str) -> Grants {
        let prefix = format!("{prefix}:grant:");
        Grants {
            channel: format!("{prefix}{instance}"),
            prefix,
            give_back: OnceLock::new(),
        }
    }

    /// The channel this client's grants come on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// What the scripts complete with a waiter's client id to publish a
    /// grant to it.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Installs what gives back the grants no parked waiter took (once; a
    /// later call is ignored).
    pub(crate) fn give_back_with(&self, give_back: GiveBack) {
        let _ = self.give_back.set(give_back);
    }

    /// Gives back `granted`, which found no waiter, on `conn`. Without a
    /// synchronizer installed (none was ever made), nothing could have
    /// been granted.
    pub(super) fn give_back(
        &self,
        conn: &mut dyn redis::ConnectionLike,
        granted: &Granted,
    ) -> redis::RedisResult<()> {
        let Some(give_back) = self.give_back.get() else {
            return Ok(());
        };
        give_back(
            conn,
            Unclaimed {
                owner: &granted.ticket[..granted.owner_len],
                request: &granted.ticket[granted.owner_len + 1..],
                token: granted.token,
                behind: &granted.behind,
                key: &granted.key,
            },
        )
    }
}

impl Granted {
    /// Reads a message: `<owner> <request> <token> <behind> <length of
    /// the key> <key><list>` (see the lock's `lib/grant.lua`). `None`: not
    /// one.
    pub(super) fn parse(message: &[u8]) -> Option<Granted> {
        let mut fields = message.splitn(6, |&byte| byte == b' ');
        let owner = std::str::from_utf8(fields.next()?).ok()?;
        let request = std::str::from_utf8(fields.next()?).ok()?;
        let token = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
        let behind = std::str::from_utf8(fields.next()?).ok()?.to_owned();
        let key_len: usize = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
        let rest = fields.next()?;
        if owner.is_empty() || request.is_empty() || rest.len() <= key_len {
            return None;
        }
        let (key, list) = rest.split_at(key_len);
        Some(Granted {
            ticket: ticket(owner, request),
            owner_len: owner.len(),
            token,
            behind,
            key: std::str::from_utf8(key).ok()?.to_owned(),
            list: std::str::from_utf8(list).ok()?.to_owned(),
        })
    }
}

impl Granted {
    /// What the waiter it names is told.
    pub(super) fn receipt(&self) -> GrantReceipt {
        GrantReceipt {
            token: self.token,
            behind: self.behind.as_str().into(),
        }
    }
}

/// The ticket a waiter parks with: the owner it would be granted to and
/// the request its park follows.
pub(crate) fn ticket(owner: &str, request: impl fmt::Display) -> String {
    format!("{owner} {request}")
}

impl fmt::Debug for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grants")
            .field("channel", &self.channel)
            .field("give_back", &self.give_back.get().is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_ticket_token_key_and_list() {
        let granted = Granted::parse(
            b"ab-12:7 42 1700000000000001 ab-12:8,5;cd:1 10 rb:{a b}:lrb:{a b}:baton",
        )
        .expect("a grant");
        assert_eq!(granted.ticket, "ab-12:7 42");
        assert_eq!(&granted.ticket[..granted.owner_len], "ab-12:7");
        assert_eq!(&granted.ticket[granted.owner_len + 1..], "42");
        assert_eq!(granted.token, 1_700_000_000_000_001);
        assert_eq!(&*granted.receipt().behind, "ab-12:8,5;cd:1");
        assert_eq!(granted.key, "rb:{a b}:l");
        assert_eq!(granted.list, "rb:{a b}:baton");
    }

    #[test]
    fn what_is_not_a_grant_is_read_as_none() {
        for message in [
            &b""[..],
            b"a:1 2",
            b"a:1 2 x ; 3 keylist",
            b"a:1 2 3 ; 8 keylist",
            b"a:1 2 3 ; 99 keylist",
            b"a:1 2 3 3 keylist",
            b" 2 3 ; 3 keylist",
        ] {
            assert_eq!(Granted::parse(message), None, "{message:?}");
        }
    }
}

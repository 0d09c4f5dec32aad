//! The crate's lock scripts, sent by hand (`EVALSHA`) by tests that check
//! what one run of a script does, as the crate builds and sends them.

use crate::support::{baton_key, hash_tag, lock_key};

pub const LEASE_MS: u64 = 30_000;
pub const BATON_TTL_MS: u64 = 5_000;
pub const FENCE_TTL_MS: u64 = 86_400_000;

pub fn fence_key(name: &str) -> String {
    format!("redbaton:{{{}}}:fence", hash_tag(name))
}

/// The crate's lock script `file` with its `lib/` helpers and the parts
/// that come first, as it sends it (`scripts!` in src/scripts/mod.rs).
pub fn script(name: &str) -> redis::Script {
    redis::Script::new(match name {
        "acquire" => concat!(
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lock/usual/acquire.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/hand_over.lua"),
            include_str!("../../src/scripts/lock/acquire.lua")
        ),
        "release" => concat!(
            include_str!("../../src/scripts/lock/usual/release.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/hand_over.lua"),
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/grant_message.lua"),
            include_str!("../../src/scripts/lib/grant.lua"),
            include_str!("../../src/scripts/lock/release.lua")
        ),
        "release_many" => concat!(
            include_str!("../../src/scripts/lock/usual/release_many.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/hand_over.lua"),
            include_str!("../../src/scripts/lock/release_many.lua")
        ),
        "withdraw" => include_str!("../../src/scripts/lock/withdraw.lua"),
        "acquire_many" => concat!(
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/hand_over.lua"),
            include_str!("../../src/scripts/lock/acquire_many.lua")
        ),
        "handoff" => concat!(
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lock/handoff.lua")
        ),
        _ => panic!("no lock script {name}"),
    })
}

/// Field `field` of `name`'s lock hash.
pub fn field(raw: &mut redis::Connection, name: &str, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(lock_key(name))
        .arg(field)
        .query(raw)
        .unwrap()
}

/// The tokens on `name`'s baton list.
pub fn tokens(raw: &mut redis::Connection, name: &str) -> u64 {
    redis::cmd("LLEN").arg(baton_key(name)).query(raw).unwrap()
}

/// The channels' prefix the crate publishes grants under (its default key
/// prefix's).
pub const GRANT_CHANNELS: &str = "redbaton:grant:";

/// The hand-over window a release opens, as the crate asks for it.
pub const WINDOW_MS: u64 = 100;

/// `id` takes `name` (a `try_lock`): its fencing token.
pub fn take(raw: &mut redis::Connection, name: &str, id: &str) -> i64 {
    let reply: Vec<i64> = script("acquire")
        .key(lock_key(name))
        .key(fence_key(name))
        .arg(id)
        .arg(LEASE_MS)
        .arg(0)
        .arg(1)
        .arg(FENCE_TTL_MS)
        .arg(1)
        .arg(-1)
        .arg(0)
        .arg(0)
        .arg(0)
        .invoke(raw)
        .unwrap();
    assert_eq!(reply[0], 1, "{id} takes {name}: {reply:?}");
    reply[1]
}

/// The last release of `id`'s ownership `fence`, opening a window if a
/// waiter of another client found it in its way; `grants`: where the
/// deployment allows grants (the release grants that waiter the lock if
/// its client hears it).
pub fn release(raw: &mut redis::Connection, name: &str, id: &str, fence: i64, grants: bool) {
    let script = script("release");
    let mut call = script.prepare_invoke();
    call.key(lock_key(name)).key(baton_key(name));
    if grants {
        call.key(fence_key(name));
    }
    call.arg(id)
        .arg(fence)
        .arg(0)
        .arg(LEASE_MS)
        .arg(BATON_TTL_MS)
        .arg(WINDOW_MS);
    if grants {
        call.arg(FENCE_TTL_MS).arg(GRANT_CHANNELS);
    }
    let freed: i64 = call.invoke(raw).unwrap();
    assert_eq!(freed, 0, "{id} frees {name}");
}

/// How long a waiter of these tests has been asking, in µs: since before
/// any window they open.
pub const LONG: i64 = 60_000_000;

/// One attempt of `id` on `name`, asking as `asking` says (-1 a
/// `try_lock`, else the µs it has been asking): `[1, fence, depth]`,
/// `[0, pttl]`, or `[0, pttl, -1]` (kept out of a window).
pub fn attempt(raw: &mut redis::Connection, name: &str, id: &str, asking: i64) -> Vec<i64> {
    attempt_popping(raw, name, id, asking, false)
}

/// [`attempt`], of a waiter rung at its baton's change (`pops`): it pops
/// the token itself.
pub fn attempt_popping(
    raw: &mut redis::Connection,
    name: &str,
    id: &str,
    asking: i64,
    pops: bool,
) -> Vec<i64> {
    script("acquire")
        .key(lock_key(name))
        .key(fence_key(name))
        .key(baton_key(name))
        .arg(id)
        .arg(LEASE_MS)
        .arg(0)
        .arg(1)
        .arg(FENCE_TTL_MS)
        .arg(1)
        .arg(asking)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(if pops { "1" } else { "0" })
        .arg(BATON_TTL_MS)
        .invoke(raw)
        .unwrap()
}

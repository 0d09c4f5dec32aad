//! The crate's lock scripts, sent by hand (`EVALSHA`) by tests that check
//! what one run of a script does, as the crate builds and sends them.

use crate::support::{baton_key, hash_tag, lock_key};

pub const LEASE_MS: u64 = 30_000;
pub const BATON_TTL_MS: u64 = 5_000;
pub const FENCE_TTL_MS: u64 = 86_400_000;

pub fn fence_key(name: &str) -> String {
    format!("redbaton:{{{}}}:fence", hash_tag(name))
}

/// The crate's lock script `file` with its `lib/` helpers, as it sends it.
pub fn script(name: &str) -> redis::Script {
    redis::Script::new(match name {
        "acquire" => concat!(
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/hand_over.lua"),
            include_str!("../../src/scripts/lock/acquire.lua")
        ),
        "release" => concat!(
            include_str!("../../src/scripts/lib/lease.lua"),
            include_str!("../../src/scripts/lib/baton.lua"),
            include_str!("../../src/scripts/lib/hand_over.lua"),
            include_str!("../../src/scripts/lib/next_fence.lua"),
            include_str!("../../src/scripts/lib/grant.lua"),
            include_str!("../../src/scripts/lock/release.lua")
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

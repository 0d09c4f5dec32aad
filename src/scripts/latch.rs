//! The count-down latch's scripts' KEYS and ARGV, each encoded in one
//! place. The `.lua` files document what each argument means.

use std::time::Duration;

use super::{millis, Call, LATCH_COUNT_DOWN, LATCH_SET_COUNT, LATCH_WAIT};
use crate::keys::LatchKeys;

/// Starts a round at `count`, unless the latch is still counting.
pub(crate) fn set_count(keys: &LatchKeys, count: u64) -> Call {
    Call::new(&LATCH_SET_COUNT)
        .key(&keys.count)
        .key(&keys.baton)
        .key(&keys.applied)
        .arg(count)
}

/// Counts one down, once per `id` however often it is sent.
pub(crate) fn count_down(keys: &LatchKeys, id: &str, baton_ttl: Duration) -> Call {
    Call::new(&LATCH_COUNT_DOWN)
        .key(&keys.count)
        .key(&keys.baton)
        .key(&keys.applied)
        .arg(id)
        .arg(millis(baton_ttl))
}

/// Whether the latch is open; a waiter that was `parked` passes the token
/// on.
pub(crate) fn wait(keys: &LatchKeys, parked: bool, baton_ttl: Duration) -> Call {
    Call::new(&LATCH_WAIT)
        .key(&keys.count)
        .key(&keys.baton)
        .arg(if parked { "1" } else { "0" })
        .arg(millis(baton_ttl))
}

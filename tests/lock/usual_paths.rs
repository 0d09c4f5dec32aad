//! The scripts' usual paths (`src/scripts/lock/usual/`), which run before
//! the rest of their script and return early, one script run at a time:
//! each answers and writes what the whole script would, and leaves every
//! other case to the paths behind it.

use crate::scripts::{
    attempt, field, release, script, take, tokens, BATON_TTL_MS, LEASE_MS, LONG, WINDOW_MS,
};
use crate::support::{baton_key, lock_key};
use testkit::RedisServer;

/// A Redlock quorum's release on one master (`lock/release_many.lua`) of
/// `names`, each `(name, identity, fence)`, each its last guard.
fn release_many(raw: &mut redis::Connection, names: &[(&str, &str, i64)]) -> Vec<i64> {
    let script = script("release_many");
    let mut call = script.prepare_invoke();
    call.arg(BATON_TTL_MS).arg(WINDOW_MS);
    for (name, identity, fence) in names {
        call.key(lock_key(name)).key(baton_key(name));
        call.arg(*identity).arg(*fence).arg(0).arg(LEASE_MS);
    }
    call.invoke(raw).unwrap()
}

/// `id`'s attempt on a held `name` as a waiter of another client that has
/// been asking for a minute: it marks the ownership `waited` and `queued`.
fn wait_for(raw: &mut redis::Connection, name: &str, id: &str) {
    let reply = attempt(raw, name, id, LONG);
    assert_eq!(reply[0], 0, "{name} is held: {reply:?}");
}

#[test]
fn a_release_of_a_lock_a_waiter_found_in_its_way_wakes_it() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "awaited", "a:1");
    wait_for(&mut raw, "awaited", "b:1");
    release(&mut raw, "awaited", "a:1", fence, false);
    assert_eq!(tokens(&mut raw, "awaited"), 1, "the waiter's token");
    assert_eq!(field(&mut raw, "awaited", "for").as_deref(), Some("b:1"));
    // And one nobody asked for: freed, nobody woken.
    let fence = take(&mut raw, "alone", "a:1");
    release(&mut raw, "alone", "a:1", fence, false);
    assert_eq!(field(&mut raw, "alone", "flag"), None, "freed");
    assert_eq!(tokens(&mut raw, "alone"), 0, "nobody to wake");
}

#[test]
fn a_quorum_release_frees_a_lock_nobody_asked_for_and_pushes_nothing() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "alone", "a:1");
    assert_eq!(release_many(&mut raw, &[("alone", "a:1", fence)]), [0]);
    assert_eq!(field(&mut raw, "alone", "flag"), None, "freed");
    assert_eq!(tokens(&mut raw, "alone"), 0, "nobody to wake");
}

#[test]
fn a_quorum_release_of_a_lock_another_holds_changes_nothing() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "other", "a:1");
    assert_eq!(release_many(&mut raw, &[("other", "b:1", fence)]), [-1]);
    assert_eq!(release_many(&mut raw, &[("other", "a:1", fence + 1)]), [-1]);
    assert_eq!(field(&mut raw, "other", "flag").as_deref(), Some("a:1"));
    assert_eq!(field(&mut raw, "other", "fence"), Some(fence.to_string()));
}

#[test]
fn a_quorum_release_of_a_lock_a_waiter_found_in_its_way_wakes_it() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "awaited", "a:1");
    wait_for(&mut raw, "awaited", "b:1");
    assert_eq!(release_many(&mut raw, &[("awaited", "a:1", fence)]), [0]);
    assert_eq!(tokens(&mut raw, "awaited"), 1, "the waiter's token");
    assert_eq!(
        field(&mut raw, "awaited", "for").as_deref(),
        Some("b:1"),
        "the window kept for it"
    );
}

#[test]
fn a_quorum_release_of_several_names_releases_each_as_its_own() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let first = take(&mut raw, "first", "a:1");
    let second = take(&mut raw, "second", "a:1");
    let third = take(&mut raw, "third", "c:1");
    wait_for(&mut raw, "second", "b:1");
    let names = [
        ("first", "a:1", first),
        ("second", "a:1", second),
        ("third", "a:1", third),
    ];
    assert_eq!(release_many(&mut raw, &names), [0, 0, -1]);
    assert_eq!(field(&mut raw, "first", "flag"), None);
    assert_eq!(tokens(&mut raw, "first"), 0);
    assert_eq!(field(&mut raw, "second", "flag"), None);
    assert_eq!(tokens(&mut raw, "second"), 1, "the second name's waiter");
    assert_eq!(field(&mut raw, "third", "flag").as_deref(), Some("c:1"));
}

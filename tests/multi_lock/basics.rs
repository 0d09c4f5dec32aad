//! All or none, names, tokens, re-entry, leases.

use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error};
use testkit::RedisServer;

use crate::support::client;
use crate::{exists, my_owner};

/// A name held elsewhere makes every attempt fail without taking any of
/// the other names, whether it gives up at once or after a wait.
#[test]
fn a_set_with_one_name_held_leaves_every_name_free() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server), client(&server));
    let held = holder.lock("aon-b").unwrap().lock().unwrap();
    let set = other.multi_lock(["aon-a", "aon-b", "aon-c"]).unwrap();
    assert!(set.try_lock().unwrap().is_none());
    assert!(!exists(&server, "aon-a") && !exists(&server, "aon-c"));
    assert!(set
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(!exists(&server, "aon-a") && !exists(&server, "aon-c"));
    // Nor are they held in this client's books.
    assert!(!other.lock("aon-a").unwrap().is_held_by_current_thread());
    held.unlock().unwrap();
    let guard = set.try_lock().unwrap().expect("every name is free now");
    assert!(exists(&server, "aon-a") && exists(&server, "aon-b") && exists(&server, "aon-c"));
    guard.unlock().unwrap();
    assert!(!exists(&server, "aon-a") && !exists(&server, "aon-b") && !exists(&server, "aon-c"));
}

/// A damaged fencing counter of the last name (not an integer) fails the
/// whole set with an error naming it, and no name is taken: the tokens
/// are issued before any lock is written.
#[test]
fn a_damaged_counter_of_one_name_fails_the_set_with_every_name_free() {
    let server = RedisServer::start();
    let client = client(&server);
    let fence = "redbaton:{dmg-c}:fence";
    redis::cmd("SET")
        .arg(fence)
        .arg("not a number")
        .query::<()>(&mut server.connection())
        .unwrap();
    let set = client.multi_lock(["dmg-a", "dmg-b", "dmg-c"]).unwrap();
    let err = set.try_lock().unwrap_err();
    assert!(
        matches!(err, Error::WrongType { .. }) && err.to_string().contains(fence),
        "{err}"
    );
    for name in ["dmg-a", "dmg-b", "dmg-c"] {
        assert!(!exists(&server, name), "{name} was taken");
    }
    let left: String = redis::cmd("GET")
        .arg(fence)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(
        left, "not a number",
        "the damaged counter is left as it was"
    );
}

/// Names are a set: duplicates count once, and the order given changes
/// nothing (two handles on the same names in other orders exclude each
/// other).
#[test]
fn names_are_a_set() {
    let server = RedisServer::start();
    let (one, two) = (client(&server), client(&server));
    let set = one
        .multi_lock(["set-c", "set-a", "set-c", "set-b"])
        .unwrap();
    assert_eq!(set.names().collect::<Vec<_>>(), ["set-a", "set-b", "set-c"]);
    let guard = set.lock().unwrap();
    assert_eq!(guard.fencing_tokens().count(), 3);
    let reversed = two.multi_lock(["set-b", "set-c", "set-a"]).unwrap();
    assert!(reversed.try_lock().unwrap().is_none());
    guard.unlock().unwrap();
    assert!(reversed.try_lock().unwrap().is_some());
}

#[test]
fn an_empty_set_or_a_bad_name_is_refused() {
    let server = RedisServer::start();
    let client = client(&server);
    let none: [&str; 0] = [];
    assert!(matches!(
        client.multi_lock(none),
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        client.multi_lock(["fine", ""]),
        Err(Error::InvalidName { .. })
    ));
}

/// Each name has the plain lock's fencing token, and the next holder of a
/// name gets a larger one.
#[test]
fn each_name_keeps_its_own_fencing_token() {
    let server = RedisServer::start();
    let client = client(&server);
    let set = client.multi_lock(["tok-a", "tok-b"]).unwrap();
    let guard = set.lock().unwrap();
    let (a, b) = (client.lock("tok-a").unwrap(), client.lock("tok-b").unwrap());
    let token_a = guard.fencing_token("tok-a").unwrap();
    let token_b = guard.fencing_token("tok-b").unwrap();
    assert_eq!(a.holder().unwrap().unwrap().fencing_token, token_a);
    assert_eq!(b.holder().unwrap().unwrap().fencing_token, token_b);
    assert_eq!(guard.fencing_token("tok-c"), None);
    assert_eq!(
        guard.fencing_tokens().collect::<Vec<_>>(),
        [("tok-a", token_a), ("tok-b", token_b)]
    );
    guard.unlock().unwrap();
    let next = a.lock().unwrap();
    assert!(next.fencing_token() > token_a);
    next.unlock().unwrap();
    let next = set.lock().unwrap();
    assert!(next.fencing_token("tok-b").unwrap() > token_b);
}

/// A thread that holds `a` and asks for `{a, b}` re-enters `a` (same
/// token, depth 2) and takes `b`; letting the set go leaves `a` held by
/// the first guard. The other way round, a name of a set this thread
/// holds is re-entered by a plain lock.
#[test]
fn a_thread_re_enters_the_names_it_holds() {
    let server = RedisServer::start();
    let client = client(&server);
    let a = client.lock("re-a").unwrap();
    let b = client.lock("re-b").unwrap();
    let outer = a.lock().unwrap();
    let set = client.multi_lock(["re-a", "re-b"]).unwrap();
    let guard = set
        .try_lock()
        .unwrap()
        .expect("a is this thread's, b is free");
    assert_eq!(guard.fencing_token("re-a"), Some(outer.fencing_token()));
    assert_eq!(a.holder().unwrap().unwrap().depth, 2);
    assert_eq!(b.holder().unwrap().unwrap().depth, 1);
    guard.unlock().unwrap();
    assert_eq!(a.holder().unwrap().unwrap().depth, 1);
    assert!(!exists(&server, "re-b"));
    outer.unlock().unwrap();
    assert!(!exists(&server, "re-a"));

    let guard = set.lock().unwrap();
    let inner = b.lock().unwrap();
    assert_eq!(Some(inner.fencing_token()), guard.fencing_token("re-b"));
    drop(guard);
    assert!(exists(&server, "re-b") && !exists(&server, "re-a"));
    inner.unlock().unwrap();
    assert!(!exists(&server, "re-b"));
}

/// `with_lock` holds every name during the section and none after it;
/// dropping a guard releases every name too.
#[test]
fn with_lock_and_drop_release_every_name() {
    let server = RedisServer::start();
    let client = client(&server);
    let set = client.multi_lock(["wl-a", "wl-b"]).unwrap();
    let inside = set
        .with_lock(|| exists(&server, "wl-a") && exists(&server, "wl-b"))
        .unwrap();
    assert!(inside);
    assert!(!exists(&server, "wl-a") && !exists(&server, "wl-b"));
    drop(set.lock().unwrap());
    assert!(!exists(&server, "wl-a") && !exists(&server, "wl-b"));
}

/// Every name's lease is renewed by the watchdog while the guard lives,
/// well past several leases.
#[test]
fn the_watchdog_renews_every_name() {
    let server = RedisServer::start();
    let holder = Client::builder(server.url())
        .default_lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let other = client(&server);
    let set = holder.multi_lock(["wd-a", "wd-b", "wd-c"]).unwrap();
    let guard = set.lock().unwrap();
    let until = Instant::now() + Duration::from_millis(2_000);
    while Instant::now() < until {
        for name in ["wd-a", "wd-b", "wd-c"] {
            assert!(
                other.lock(name).unwrap().try_lock().unwrap().is_none(),
                "{name} ran out while its guard lived"
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());
    guard.unlock().unwrap();
}

/// A failed attempt leaves no name under this thread's identity in Redis
/// (checked by owner, not only by key).
#[test]
fn a_failed_attempt_leaves_nothing_under_this_thread() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server), client(&server));
    let held = holder.lock("fail-c").unwrap().lock().unwrap();
    let me = my_owner(&other, "fail");
    let set = other.multi_lock(["fail-a", "fail-b", "fail-c"]).unwrap();
    assert!(set
        .try_lock_for(Duration::from_millis(200))
        .unwrap()
        .is_none());
    for name in ["fail-a", "fail-b", "fail-c"] {
        let holder = other.lock(name).unwrap().holder().unwrap();
        assert!(holder.is_none_or(|h| h.owner != me), "{name} left held");
    }
    held.unlock().unwrap();
}

/// Uncontended, a set of names on one server costs one round trip to
/// take and one to release, as one lock does: with every request held up
/// 200 ms by a proxy, a cycle takes two delays, not three or four.
#[test]
fn an_uncontended_cycle_is_one_round_trip_each_way() {
    let server = RedisServer::start();
    let proxy = testkit::FaultProxy::start(server.port());
    let client = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let set = client.multi_lock(["rt-a", "rt-b", "rt-c"]).unwrap();
    let single = client.lock("rt-single").unwrap();
    // Connections, the thread's identity and the scripts, before timing.
    set.lock().unwrap().unlock().unwrap();
    single.lock().unwrap().unlock().unwrap();
    let delay = Duration::from_millis(200);
    proxy.set_delay(delay);
    let cycle = |run: &dyn Fn()| {
        let start = Instant::now();
        run();
        start.elapsed()
    };
    let multi = cycle(&|| set.lock().unwrap().unlock().unwrap());
    let one = cycle(&|| single.lock().unwrap().unlock().unwrap());
    proxy.set_delay(Duration::ZERO);
    assert!(one >= delay * 2, "{one:?}");
    assert!(
        multi >= delay * 2 && multi < delay * 5 / 2,
        "a cycle of three names took {multi:?} (one name: {one:?})"
    );
}

/// A name lost meanwhile (force-unlocked) makes `unlock` report it, and
/// every other name is released all the same.
#[test]
fn unlock_reports_a_lost_name_and_releases_the_others() {
    let server = RedisServer::start();
    let (holder, admin) = (client(&server), client(&server));
    let set = holder
        .multi_lock(["lostn-a", "lostn-b", "lostn-c"])
        .unwrap();
    let guard = set.lock().unwrap();
    assert!(admin.lock("lostn-b").unwrap().force_unlock().unwrap());
    let released = guard.unlock();
    assert!(
        matches!(&released, Err(Error::LockLost { name }) if name == "lostn-b"),
        "{released:?}"
    );
    assert!(!exists(&server, "lostn-a") && !exists(&server, "lostn-c"));
}

//! Write grants (`lib/write_grant.lua`): a release that frees the lock for
//! a waiting writer (a writer's last release, the last reader's release,
//! the upgradable reader's last release)
//! grants the write hold to the first waiting writer, when that writer of
//! another process left a grant spec with its place, and tells its client,
//! instead of pushing a write baton for it to try again. First through
//! clients, then one script run at a time.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;

use crate::grants::{parking_long, written, GRANT_CHANNELS};
use crate::support::{self, eventually, hand_off_commands, JoinWithin};
use crate::{rw_key, rw_script};

/// A writer of `client`'s on `name` that waits up to 20 s, holds the lock
/// (a fixed lease of 2 s, a grant's: no renewal runs beside the hand-off)
/// and releases it; it sends its fencing token on `tokens`.
fn granted_writer(client: Client, name: &'static str, tokens: mpsc::Sender<u64>) -> impl FnOnce() {
    move || {
        let lock = client
            .rw_lock(name)
            .unwrap()
            .with_fixed_lease(Duration::from_secs(2))
            .unwrap();
        let guard = lock
            .try_write_for(Duration::from_secs(20))
            .unwrap()
            .expect("written");
        tokens.send(guard.fencing_token()).unwrap();
        guard.unlock().unwrap();
    }
}

/// The writers whose grant spec of `name` is left.
fn specs(server: &RedisServer, name: &str) -> Vec<String> {
    redis::cmd("HKEYS")
        .arg(rw_key(name, "wgrants"))
        .query(&mut server.connection())
        .unwrap()
}

/// No write baton was pushed for `name` in the commands `used`: the two
/// pushes there are the granted writer's release's, of the read and the
/// upgradable batons (readers its place may have held back).
fn assert_no_write_baton(
    server: &RedisServer,
    name: &str,
    used: &std::collections::BTreeMap<String, u64>,
) {
    assert_eq!(used.get("rpush"), Some(&2), "{used:?}");
    let mut raw = server.connection();
    for (baton, pushed) in [("wbaton", 0), ("rbaton", 1), ("ubaton", 1)] {
        let len: i64 = redis::cmd("LLEN")
            .arg(rw_key(name, baton))
            .query(&mut raw)
            .unwrap();
        assert_eq!(len, pushed, "{baton}");
    }
}

/// A writer of another client parked behind a write wakes holding it: the
/// release is the one script between them, no write baton is pushed or
/// popped, and its fencing token is above the holder's.
#[test]
fn a_writer_of_another_client_parked_behind_a_write_is_granted_it() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.rw_lock("written").unwrap().write().unwrap();
    let before = held.fencing_token();
    let (tokens, token) = mpsc::channel();
    let wait = granted_writer(parking_long(&server), "written", tokens);
    let used = hand_off_commands(&server, wait, || held.unlock().unwrap());
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    // The release, then the writer's own release: no write attempt.
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_no_write_baton(&server, "written", &used);
    assert!(token.recv().unwrap() > before, "the grant's token is above");
    assert!(specs(&server, "written").is_empty(), "the spec went");
}

/// A grant that comes long after the attempt its waiter's park followed
/// (here: 800 ms of a hold, past a quarter of the grant's lease) is
/// confirmed by one renewal and taken: the release, the renewal and the
/// writer's own release.
#[test]
fn a_late_write_grant_is_renewed_and_taken() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.rw_lock("late").unwrap().write().unwrap();
    let (tokens, token) = mpsc::channel();
    let wait = granted_writer(parking_long(&server), "late", tokens);
    let used = hand_off_commands(&server, wait, || {
        // The hold this test is about, not a wait for another thread.
        thread::sleep(Duration::from_millis(800));
        held.unlock().unwrap()
    });
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(support::scripts_run(&used), 3, "{used:?}");
    assert_no_write_baton(&server, "late", &used);
    assert!(token.recv().unwrap() > 0);
}

/// A granted write hold starts with the grant's lease (2 s) and is
/// lengthened to the writer's own by the watchdog at once: held well past
/// the grant's lease, it still keeps other writers out and ends with its
/// own release.
#[test]
fn a_granted_write_is_lengthened_to_the_writers_own_lease() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.rw_lock("lengthened").unwrap().write().unwrap();
    let lock = parking_long(&server).rw_lock("lengthened").unwrap();
    let (granted, writing) = mpsc::channel();
    let (done, finish) = mpsc::channel::<()>();
    let writer = thread::spawn(move || {
        let guard = lock
            .try_write_for(Duration::from_secs(20))
            .unwrap()
            .expect("granted");
        granted.send(()).unwrap();
        finish.recv().unwrap();
        guard.unlock()
    });
    eventually(Duration::from_secs(10), "the writer parked", || {
        support::parked(&server) == 1 && specs(&server, "lengthened").len() == 1
    });
    let before = server.command_calls();
    held.unlock().unwrap();
    writing.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        server.commands_since(&before).get("publish"),
        Some(&1),
        "granted, not woken"
    );
    // Past the grant's lease: the hold is the writer's own lease's now.
    thread::sleep(Duration::from_millis(2_500)); // the stretch under test
    let other = holder.rw_lock("lengthened").unwrap();
    assert!(
        other.try_write().unwrap().is_none(),
        "another writer got in"
    );
    done.send(()).unwrap();
    writer.joined().expect("released as its own");
}

/// The last reader's release grants the write hold to the writer parked
/// behind the readers; a release that leaves a reader grants nothing.
#[test]
fn the_last_readers_release_grants_the_write_hold() {
    let server = RedisServer::start();
    // Two clients: two readers in this one thread.
    let (one, two) = (
        Client::open(&server.url()).unwrap(),
        Client::open(&server.url()).unwrap(),
    );
    let first = one.rw_lock("read").unwrap().read().unwrap();
    let last = two.rw_lock("read").unwrap().read().unwrap();
    let (tokens, token) = mpsc::channel();
    let writer = thread::spawn(granted_writer(parking_long(&server), "read", tokens));
    eventually(Duration::from_secs(10), "the writer parked", || {
        support::parked(&server) == 1 && specs(&server, "read").len() == 1
    });
    let before = server.command_calls();
    first.unlock().unwrap();
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), None, "a reader is left: {used:?}");
    let before = server.command_calls();
    last.unlock().unwrap();
    writer.joined();
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    // The last reader's release, then the writer's own release.
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_no_write_baton(&server, "read", &used);
    assert!(token.recv().unwrap() > 0);
}

/// The upgradable reader's last release grants the write hold to the
/// writer parked behind it, as a writer's release does.
#[test]
fn the_upgradable_readers_release_grants_the_write_hold() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder
        .rw_lock("upgradable")
        .unwrap()
        .upgradable_read()
        .unwrap();
    let (tokens, token) = mpsc::channel();
    let wait = granted_writer(parking_long(&server), "upgradable", tokens);
    let used = hand_off_commands(&server, wait, || held.unlock().unwrap());
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    // The release, then the writer's own release: no write attempt.
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_no_write_baton(&server, "upgradable", &used);
    assert!(token.recv().unwrap() > 0);
}

/// A waiting writer that gives up leaves no spec behind: a release after
/// it grants it nothing (a grant would be given back).
#[test]
fn a_writer_that_gives_up_takes_its_spec_off() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.rw_lock("given-up").unwrap().write().unwrap();
    let waiting = parking_long(&server);
    let lock = waiting.rw_lock("given-up").unwrap();
    let writer = thread::spawn(move || {
        let refused = lock.try_write_for(Duration::from_millis(1_500)).unwrap();
        assert!(refused.is_none(), "written while held");
    });
    eventually(Duration::from_secs(10), "the writer's spec left", || {
        specs(&server, "given-up").len() == 1
    });
    writer.joined();
    assert!(specs(&server, "given-up").is_empty(), "its spec stayed");
    held.unlock().unwrap();
}

/// write.lua for `writer`, request `request`, from a waiter that keeps a
/// place (60 s) and may be granted (a 2 s grant lease).
fn write_grantable(
    raw: &mut redis::Connection,
    name: &str,
    writer: &str,
    request: u64,
) -> Vec<i64> {
    let script = rw_script("write");
    let mut call = script.prepare_invoke();
    for part in [
        "write",
        "readers",
        "depths",
        "writers",
        "fence",
        "upgradable",
        "wbaton",
        "wgrants",
    ] {
        call.key(rw_key(name, part));
    }
    call.arg(writer)
        .arg(30_000)
        .arg(0)
        .arg(1)
        .arg(60_000)
        .arg(request)
        .arg(60_000)
        .arg(0)
        .arg(0)
        .arg(2_000)
        .arg(60_000);
    call.invoke(raw).unwrap()
}

/// release_write.lua: the last release of `writer`'s hold under `fence`,
/// granting on the default channels; what it answered.
fn release_write_granting(
    raw: &mut redis::Connection,
    name: &str,
    writer: &str,
    fence: u64,
) -> i64 {
    let script = rw_script("release_write");
    let mut release = script.prepare_invoke();
    for part in [
        "write",
        "readers",
        "depths",
        "writers",
        "rbaton",
        "wbaton",
        "upgradable",
        "ubaton",
        "rgrants",
        "wgrants",
        "fence",
    ] {
        release.key(rw_key(name, part));
    }
    release
        .arg(writer)
        .arg(fence)
        .arg(0)
        .arg(30_000)
        .arg(5_000)
        .arg(GRANT_CHANNELS)
        .arg(60_000);
    release.invoke(raw).unwrap()
}

/// The write hold of `name`: its owner and fence, if there is one.
fn write_hold(raw: &mut redis::Connection, name: &str) -> (Option<String>, Option<String>) {
    redis::cmd("HMGET")
        .arg(rw_key(name, "write"))
        .arg("flag")
        .arg("fence")
        .query(raw)
        .unwrap()
}

/// A grant nobody hears (the waiter's client does not listen: it ended,
/// or its channel is refused) writes no hold, and the write baton is
/// pushed for the waiter instead, as before grants.
#[test]
fn a_write_grant_nobody_hears_pushes_the_write_baton_instead() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    written(&mut raw, "unheard");
    assert_eq!(
        write_grantable(&mut raw, "unheard", "w:2", 42)[..3],
        [0, -1, 1]
    );
    assert_eq!(release_write_granting(&mut raw, "unheard", "w:1", 7), 0);
    assert_eq!(
        write_hold(&mut raw, "unheard"),
        (None, None),
        "no hold written"
    );
    let batons: i64 = redis::cmd("LLEN")
        .arg(rw_key("unheard", "wbaton"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(batons, 1, "a write baton for the waiter");
}

/// A waiting writer that takes the lock by its own attempt (the holder's
/// lease ran out) takes its spec off with it.
#[test]
fn a_writer_that_takes_the_lock_by_its_attempt_leaves_no_spec() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    written(&mut raw, "expired");
    assert_eq!(
        write_grantable(&mut raw, "expired", "w:2", 42)[..3],
        [0, -1, 1]
    );
    let _: () = redis::cmd("DEL")
        .arg(rw_key("expired", "write"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(write_grantable(&mut raw, "expired", "w:2", 43)[0], 1);
    assert!(specs(&server, "expired").is_empty(), "its spec stayed");
}

/// The first waiting writer (the oldest place) is the one granted; one
/// without a spec there is woken, and the writer with a spec behind it
/// is not granted over it.
#[test]
fn only_the_first_waiting_writer_is_granted() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    // Client "w" hears its grants.
    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}w")).unwrap();
    for first_has_spec in [true, false] {
        let name = format!("first-{first_has_spec}");
        written(&mut raw, &name);
        assert_eq!(write_grantable(&mut raw, &name, "w:2", 42)[..3], [0, -1, 1]);
        assert_eq!(write_grantable(&mut raw, &name, "w:3", 43)[..3], [0, -1, 1]);
        // w:3's place ends later than w:2's (both asked within a ms).
        let _: f64 = redis::cmd("ZINCRBY")
            .arg(rw_key(&name, "writers"))
            .arg(1_000)
            .arg("w:3")
            .query(&mut raw)
            .unwrap();
        if !first_has_spec {
            let _: () = redis::cmd("HDEL")
                .arg(rw_key(&name, "wgrants"))
                .arg("w:2")
                .query(&mut raw)
                .unwrap();
        }
        assert_eq!(release_write_granting(&mut raw, &name, "w:1", 7), 0);
        let (owner, fence) = write_hold(&mut raw, &name);
        let batons: i64 = redis::cmd("LLEN")
            .arg(rw_key(&name, "wbaton"))
            .query(&mut raw)
            .unwrap();
        if first_has_spec {
            assert_eq!(owner.as_deref(), Some("w:2"));
            let message: String = pubsub.get_message().unwrap().get_payload().unwrap();
            // `<waiter> <req> <token> <behind> <key length> <key><list>`
            let fields: Vec<&str> = message.splitn(6, ' ').collect();
            assert_eq!(fields[..2], ["w:2", "42"], "{message}");
            assert_eq!(fields[2], fence.unwrap(), "{message}");
            assert_eq!(fields[3], "w", "{message}");
            assert_eq!(batons, 0);
            assert_eq!(specs(&server, &name), ["w:3"], "the other spec stays");
        } else {
            assert_eq!(owner, None, "granted over the first");
            assert_eq!(batons, 1, "the first is woken");
        }
    }
}

/// An attempt of the granted waiter that comes before its client heard the
/// grant (its park had ended) takes the hold as a leftover of its own,
/// under a new fence; the client's give-back of the grant then finds
/// nothing to release. Without the attempt, the give-back frees the lock.
#[test]
fn a_write_grant_taken_by_the_waiters_next_attempt_is_not_given_back() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}w")).unwrap();
    for attempted in [false, true] {
        let name = format!("attempted-{attempted}");
        written(&mut raw, &name);
        assert_eq!(write_grantable(&mut raw, &name, "w:2", 42)[..3], [0, -1, 1]);
        assert_eq!(release_write_granting(&mut raw, &name, "w:1", 7), 0);
        let _: redis::Msg = pubsub.get_message().unwrap();
        let (_, granted) = write_hold(&mut raw, &name);
        let granted: u64 = granted.expect("granted").parse().unwrap();
        if attempted {
            let reply = write_grantable(&mut raw, &name, "w:2", 44);
            assert_eq!(reply[0], 1, "the attempt takes it");
            assert!(reply[1] as u64 > granted, "under a new fence");
        }
        let given = release_write_granting(&mut raw, &name, "w:2", granted);
        let (owner, _) = write_hold(&mut raw, &name);
        if attempted {
            assert_eq!(given, -1);
            assert_eq!(
                owner.as_deref(),
                Some("w:2"),
                "the hold its waiter took stays"
            );
        } else {
            assert_eq!(given, 0);
            assert_eq!(owner, None, "the grant given back");
        }
    }
}

/// A grant no parked waiter takes (a spec of another thread of a client
/// whose hub listens, first in line) is given back by that client at
/// once, and the give-back grants the writer behind it.
#[test]
fn a_write_grant_no_parked_waiter_takes_is_given_back_to_the_next_writer() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.rw_lock("unclaimed").unwrap().write().unwrap();
    let (tokens, token) = mpsc::channel();
    let writer = thread::spawn(granted_writer(parking_long(&server), "unclaimed", tokens));
    let mut waiter = Vec::new();
    eventually(Duration::from_secs(10), "the writer parked", || {
        waiter = specs(&server, "unclaimed");
        support::parked(&server) == 1 && waiter.len() == 1
    });
    // Another thread of the same client, request 999999, first in line
    // (its place ends before the parked writer's): no thread parks after
    // that request.
    let mut raw = server.connection();
    let client_id = waiter[0].split(':').next().unwrap();
    let stray = format!("{client_id}:999");
    let (seconds, _): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(rw_key("unclaimed", "writers"))
        .arg((seconds + 10) * 1000)
        .arg(&stray)
        .query(&mut raw)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(rw_key("unclaimed", "wgrants"))
        .arg(&stray)
        .arg("999999 60000")
        .query(&mut raw)
        .unwrap();
    let before = server.command_calls();
    held.unlock().unwrap();
    token
        .recv_timeout(Duration::from_secs(5))
        .expect("served after the give-back");
    writer.joined();
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&2), "granted twice: {used:?}");
}

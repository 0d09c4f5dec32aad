//! Read grants (`release_write.lua`): a writer's last release grants the
//! read to the waiting readers of other processes whose refusal by its
//! hold left a grant spec, where no writer waits, and tells their clients,
//! instead of pushing a read baton for them to try again. First through
//! clients, then one script run at a time.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;

use crate::support::{self, eventually, hand_off_commands, JoinWithin};
use crate::{rw_key, rw_script};

/// The clients' grant channels under the default prefix.
pub(crate) const GRANT_CHANNELS: &str = "redbaton:grant:";

/// A client of `server` whose waiters park long (30 s): a wait that ends
/// sooner ended by a grant or a wake, not by its park's end.
pub(crate) fn parking_long(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Waits until `waiters` readers of read-write lock `name` left a grant
/// spec and `parked` waiters are parked on `server`; the specs' readers.
fn specs_left(server: &RedisServer, name: &str, waiters: usize, parked: u64) -> Vec<String> {
    let mut raw = server.connection();
    let mut readers = Vec::new();
    eventually(
        Duration::from_secs(10),
        "the readers left their specs",
        || {
            readers = redis::cmd("HKEYS")
                .arg(rw_key(name, "rgrants"))
                .query(&mut raw)
                .unwrap();
            readers.len() == waiters && support::parked(server) == parked
        },
    );
    readers
}

/// A reader of another client parked behind a write wakes holding the
/// read: the writer's release is the one script between them, and no read
/// baton is pushed or popped.
#[test]
fn a_reader_of_another_client_parked_behind_a_write_is_granted_the_read() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let waiting = parking_long(&server);
    let held = holder.rw_lock("granted").unwrap().write().unwrap();
    let lock = waiting.rw_lock("granted").unwrap();
    let wait = move || {
        let guard = lock.try_read_for(Duration::from_secs(20)).unwrap();
        guard.expect("granted").unlock().unwrap();
    };
    let used = hand_off_commands(&server, wait, || held.unlock().unwrap());
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    assert_eq!(used.get("rpush"), None, "{used:?}");
    // The release, then the reader's own release: no read attempt.
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    let mut raw = server.connection();
    let specs: i64 = redis::cmd("EXISTS")
        .arg(rw_key("granted", "rgrants"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(specs, 0, "the spec went with the grant");
}

/// Writers come first: a writer's release while another writer waits
/// grants no read; the waiting writer gets in, and the reader only after
/// it.
#[test]
fn no_read_is_granted_while_a_writer_waits() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let readers = parking_long(&server);
    let writers = parking_long(&server);
    let held = holder.rw_lock("preferred").unwrap().write().unwrap();
    let (events, seen) = mpsc::channel();
    let read_events = events.clone();
    let reader = thread::spawn(move || {
        let lock = readers.rw_lock("preferred").unwrap();
        let guard = lock.try_read_for(Duration::from_secs(20)).unwrap();
        read_events.send("read").unwrap();
        guard.expect("read").unlock().unwrap();
    });
    specs_left(&server, "preferred", 1, 1);
    let writer = thread::spawn(move || {
        let lock = writers.rw_lock("preferred").unwrap();
        let guard = lock.try_write_for(Duration::from_secs(20)).unwrap();
        events.send("write").unwrap();
        thread::sleep(Duration::from_millis(200)); // the hold the reader must not overlap
        events.send("write ends").unwrap();
        guard.expect("write").unlock().unwrap();
    });
    eventually(Duration::from_secs(10), "the writer waits", || {
        support::parked(&server) == 2
    });
    held.unlock().unwrap();
    let order: Vec<&str> = (0..3)
        .map(|_| seen.recv_timeout(Duration::from_secs(20)).expect("served"))
        .collect();
    assert_eq!(order, ["write", "write ends", "read"]);
    writer.joined();
    reader.joined();
}

/// A grant no parked waiter takes (a request no thread parks after, of a
/// client whose hub listens because another of its threads waits) is
/// given back by that client at once, not kept for the grant's lease.
#[test]
fn a_read_grant_no_parked_waiter_takes_is_given_back_at_once() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let listening = parking_long(&server);
    let held = holder.rw_lock("unclaimed").unwrap().write().unwrap();
    let lock = listening.rw_lock("unclaimed").unwrap();
    let parked_reader = thread::spawn(move || {
        let guard = lock.try_read_for(Duration::from_secs(20)).unwrap();
        guard.expect("granted").unlock().unwrap();
    });
    let reader = specs_left(&server, "unclaimed", 1, 1).remove(0);
    let mut raw = server.connection();
    let specs_key = rw_key("unclaimed", "rgrants");
    // Another thread of the same client, request 999999, as far as the
    // script knows: no thread parks after that request.
    let client_id = reader.split(':').next().unwrap();
    let stray = format!("{client_id}:999");
    let _: () = redis::cmd("HSET")
        .arg(&specs_key)
        .arg(&stray)
        .arg("999999 60000")
        .query(&mut raw)
        .unwrap();
    held.unlock().unwrap();
    parked_reader.joined();
    let readers = rw_key("unclaimed", "readers");
    eventually(Duration::from_secs(5), "the stray grant given back", || {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&readers)
            .arg(&stray)
            .query(&mut raw)
            .unwrap();
        score.is_none()
    });
}

/// Read-write lock `name` held for writing by `w:1` (fence 7), as the
/// scripts below find it.
pub(crate) fn written(raw: &mut redis::Connection, name: &str) {
    let write: i64 = redis::cmd("HSET")
        .arg(rw_key(name, "write"))
        .arg("flag")
        .arg("w:1")
        .arg("count")
        .arg(1)
        .arg("fence")
        .arg(7)
        .query(raw)
        .unwrap();
    assert_eq!(write, 3);
}

/// read.lua for `r:1`, request 42, from a waiter that may be granted (a
/// 2 s grant lease, its spec living 60 s).
fn read_grantable(raw: &mut redis::Connection, name: &str) -> Vec<i64> {
    let script = rw_script("read");
    let mut call = script.prepare_invoke();
    for part in [
        "write",
        "readers",
        "depths",
        "writers",
        "rbaton",
        "upgradable",
        "rgrants",
    ] {
        call.key(rw_key(name, part));
    }
    call.arg("r:1")
        .arg(30_000)
        .arg(0)
        .arg(1)
        .arg(42)
        .arg(1)
        .arg(5_000)
        .arg(0)
        .arg(2_000)
        .arg(60_000);
    call.invoke(raw).unwrap()
}

/// release_write.lua: `w:1`'s last release, granting on the default
/// channels.
fn release_write_granting(raw: &mut redis::Connection, name: &str) {
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
    ] {
        release.key(rw_key(name, part));
    }
    release
        .arg("w:1")
        .arg(7)
        .arg(0)
        .arg(30_000)
        .arg(5_000)
        .arg(GRANT_CHANNELS);
    assert_eq!(release.invoke::<i64>(raw).unwrap(), 0);
}

/// The lease end of `r:1`'s read hold of `name`, if it has one.
fn read_hold_end(raw: &mut redis::Connection, name: &str) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(rw_key(name, "readers"))
        .arg("r:1")
        .query(raw)
        .unwrap()
}

/// A grant nobody hears (the waiter's client does not listen: it ended,
/// or its channel is refused) writes no hold, and a read baton is pushed
/// for the waiter instead, as before grants.
#[test]
fn a_read_grant_nobody_hears_pushes_a_read_baton_instead() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    written(&mut raw, "unheard");
    assert_eq!(read_grantable(&mut raw, "unheard")[..3], [0, -1, 1]);
    release_write_granting(&mut raw, "unheard");
    assert_eq!(read_hold_end(&mut raw, "unheard"), None, "no hold written");
    let batons: i64 = redis::cmd("LLEN")
        .arg(rw_key("unheard", "rbaton"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(batons, 1, "a read baton for the waiter");
}

/// A spec whose reader holds a read already (it got in another way, and
/// its spec was left) grants nothing over that hold: its depth and token
/// stay.
#[test]
fn no_read_is_granted_over_a_live_read_hold() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    // Client "r" hears its grants.
    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}r")).unwrap();
    written(&mut raw, "held");
    assert_eq!(read_grantable(&mut raw, "held")[..3], [0, -1, 1]);
    // r:1 reads (depth 2, token 5) beside the write, as a downgrade would.
    let _: () = redis::cmd("ZADD")
        .arg(rw_key("held", "readers"))
        .arg(i64::MAX / 2)
        .arg("r:1")
        .query(&mut raw)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(rw_key("held", "depths"))
        .arg("r:1")
        .arg("2:5")
        .query(&mut raw)
        .unwrap();
    release_write_granting(&mut raw, "held");
    let depth: String = redis::cmd("HGET")
        .arg(rw_key("held", "depths"))
        .arg("r:1")
        .query(&mut raw)
        .unwrap();
    assert_eq!(depth, "2:5", "the live hold kept");
}

/// An attempt sent again after its reply was lost finds its own request's
/// granted read and takes it; its end moves on, so that the client's
/// give-back of the grant (which names the end it wrote) leaves it.
/// Without the attempt, the same give-back ends the hold.
#[test]
fn a_read_grant_taken_by_the_waiters_resent_attempt_is_not_given_back() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    // Client "r" hears its grants.
    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}r")).unwrap();
    for resent in [false, true] {
        let name = format!("resent-{resent}");
        written(&mut raw, &name);
        assert_eq!(
            read_grantable(&mut raw, &name)[..3],
            [0, -1, 1],
            "refused, a spec left"
        );
        release_write_granting(&mut raw, &name);
        let message: String = pubsub.get_message().unwrap().get_payload().unwrap();
        // `<waiter> <req> <token> <behind> <key length> <key><list>`
        let fields: Vec<&str> = message.splitn(6, ' ').collect();
        assert_eq!(fields[..3], ["r:1", "42", "42"], "{message}");
        let ends = fields[3].to_owned();
        let score = read_hold_end(&mut raw, &name).expect("the grant wrote the hold");
        assert_eq!(score.to_string(), ends, "the grant wrote the hold");
        if resent {
            assert_eq!(
                read_grantable(&mut raw, &name),
                [1, 42, 1],
                "the resent attempt takes it"
            );
        }
        let give_back_script = rw_script("release_read");
        let mut give_back = give_back_script.prepare_invoke();
        for part in [
            "write",
            "readers",
            "depths",
            "writers",
            "wbaton",
            "upgradable",
            "upbaton",
        ] {
            give_back.key(rw_key(&name, part));
        }
        give_back
            .arg("r:1")
            .arg(42)
            .arg(0)
            .arg(30_000)
            .arg(5_000)
            .arg(&ends);
        let given: i64 = give_back.invoke(&mut raw).unwrap();
        let left = read_hold_end(&mut raw, &name);
        if resent {
            assert_eq!(given, -1);
            assert!(left.is_some(), "the hold its waiter took stays");
        } else {
            assert_eq!(given, 0);
            assert!(left.is_none(), "the grant given back");
        }
    }
}

/// A granted read starts with the grant's lease (2 s) and is lengthened
/// to the reader's own by the watchdog at once: held well past the
/// grant's lease, it still keeps writers out and ends with its own
/// release.
#[test]
fn a_granted_read_is_lengthened_to_the_readers_own_lease() {
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let waiting = parking_long(&server);
    let held = holder.rw_lock("lengthened").unwrap().write().unwrap();
    let lock = waiting.rw_lock("lengthened").unwrap();
    let (granted, reading) = mpsc::channel();
    let (done, finish) = mpsc::channel::<()>();
    let reader = thread::spawn(move || {
        let guard = lock
            .try_read_for(Duration::from_secs(20))
            .unwrap()
            .expect("granted");
        granted.send(()).unwrap();
        finish.recv().unwrap();
        guard.unlock()
    });
    specs_left(&server, "lengthened", 1, 1);
    let before = server.command_calls();
    held.unlock().unwrap();
    reading.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        server.commands_since(&before).get("publish"),
        Some(&1),
        "granted, not woken"
    );
    // Past the grant's lease: the hold is the reader's own lease's now.
    thread::sleep(Duration::from_millis(2_500)); // the stretch under test
    let writer = holder.rw_lock("lengthened").unwrap();
    assert!(writer.try_write().unwrap().is_none(), "a writer got in");
    done.send(()).unwrap();
    reader.joined().expect("released as its own");
}

//! A request sent twice: the transport sends a script again on a fresh
//! connection when the first one's reply was lost (it may have run). Every
//! acquisition and release must then take effect once, also when another
//! client's request ran in between. Checked with the crate's own scripts
//! sent twice by hand (`EVALSHA`), and end to end through a proxy that
//! loses one reply (`testkit::FaultProxy`).

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::support::{eventually, JoinWithin};
use crate::{rw_key, rw_script, rw_state};
use redbaton::Client;
use testkit::{FaultProxy, RedisServer};

const LEASE_MS: u64 = 30_000;
const BATON_TTL_MS: u64 = 5_000;
const FENCE_TTL_MS: u64 = 86_400_000;

/// `rwlock/read.lua` for `id` as request `request` (`held`: the token of
/// its live read guards, 0 for none; `depth` after this acquisition).
fn read(
    raw: &mut redis::Connection,
    name: &str,
    id: &str,
    request: u64,
    held: u64,
    depth: u64,
) -> Vec<i64> {
    rw_script("read")
        .key(rw_key(name, "write"))
        .key(rw_key(name, "readers"))
        .key(rw_key(name, "depths"))
        .key(rw_key(name, "writers"))
        .key(rw_key(name, "rbaton"))
        .key(rw_key(name, "upgradable"))
        .arg(id)
        .arg(LEASE_MS)
        .arg(held)
        .arg(depth)
        .arg(request)
        .arg("0")
        .arg(BATON_TTL_MS)
        .invoke(raw)
        .unwrap()
}

/// `rwlock/write.lua` for `id` as request `request`, keeping a place of
/// `place_ms` when refused (0: none).
fn write(
    raw: &mut redis::Connection,
    name: &str,
    id: &str,
    request: u64,
    held: u64,
    depth: u64,
    place_ms: u64,
) -> Vec<i64> {
    rw_script("write")
        .key(rw_key(name, "write"))
        .key(rw_key(name, "readers"))
        .key(rw_key(name, "depths"))
        .key(rw_key(name, "writers"))
        .key(rw_key(name, "fence"))
        .key(rw_key(name, "upgradable"))
        .arg(id)
        .arg(LEASE_MS)
        .arg(held)
        .arg(depth)
        .arg(FENCE_TTL_MS)
        .arg(request)
        .arg(place_ms)
        .arg(0)
        .invoke(raw)
        .unwrap()
}

/// `rwlock/release_read.lua`: one level of `id`'s read hold `token`,
/// leaving `left` guards.
fn release_read(raw: &mut redis::Connection, name: &str, id: &str, token: u64, left: u64) -> i64 {
    rw_script("release_read")
        .key(rw_key(name, "write"))
        .key(rw_key(name, "readers"))
        .key(rw_key(name, "depths"))
        .key(rw_key(name, "writers"))
        .key(rw_key(name, "wbaton"))
        .key(rw_key(name, "upgradable"))
        .key(rw_key(name, "upbaton"))
        .arg(id)
        .arg(token)
        .arg(left)
        .arg(LEASE_MS)
        .arg(BATON_TTL_MS)
        .invoke(raw)
        .unwrap()
}

/// `rwlock/release_write.lua`: one level of `id`'s write hold `fence`,
/// leaving `left` guards.
fn release_write(raw: &mut redis::Connection, name: &str, id: &str, fence: u64, left: u64) -> i64 {
    rw_script("release_write")
        .key(rw_key(name, "write"))
        .key(rw_key(name, "readers"))
        .key(rw_key(name, "depths"))
        .key(rw_key(name, "writers"))
        .key(rw_key(name, "rbaton"))
        .key(rw_key(name, "wbaton"))
        .key(rw_key(name, "upgradable"))
        .key(rw_key(name, "ubaton"))
        .arg(id)
        .arg(fence)
        .arg(left)
        .arg(LEASE_MS)
        .arg(BATON_TTL_MS)
        .invoke(raw)
        .unwrap()
}

fn llen(raw: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("LLEN").arg(key).query(raw).unwrap()
}

fn fence_counter(raw: &mut redis::Connection, name: &str) -> u64 {
    redis::cmd("GET")
        .arg(rw_key(name, "fence"))
        .query::<Option<u64>>(raw)
        .unwrap()
        .unwrap_or(0)
}

#[test]
fn a_read_sent_twice_with_a_writer_queued_in_between_is_one_hold_not_a_stranded_one() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    assert_eq!(read(&mut raw, "r", "reader:1", 41, 0, 1), [1, 41, 1]);
    // Another client's writer queues before the resend arrives.
    let refused = write(&mut raw, "r", "writer:1", 7, 0, 1, 10_000);
    assert_eq!(refused[0], 0, "a reader holds");
    // The resend recognises its first run: the reader has its guard, and
    // will release it (refused, the hold would be nobody's for 30 s).
    assert_eq!(
        read(&mut raw, "r", "reader:1", 41, 0, 1),
        [1, 41, 1],
        "{:?}",
        rw_state(&mut raw, "r")
    );
    let state = rw_state(&mut raw, "r");
    assert!(
        state[1].contains("reader:1") && state[2] == r#"depths [("reader:1", "1:41")]"#,
        "{state:?}"
    );
    // Its one release lets the queued writer in at once.
    assert_eq!(release_read(&mut raw, "r", "reader:1", 41, 0), 0);
    assert_eq!(
        llen(&mut raw, &rw_key("r", "wbaton")),
        1,
        "the writer is woken"
    );
    assert_eq!(write(&mut raw, "r", "writer:1", 8, 0, 1, 10_000)[0], 1);
}

#[test]
fn a_write_sent_twice_is_one_hold_under_one_fencing_token() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let first = write(&mut raw, "w", "writer:1", 9, 0, 1, 10_000);
    assert_eq!(first[0], 1);
    let fence = first[1];
    // In between: a reader and another writer are refused (the reader
    // marks the hold so that its release wakes readers).
    assert_eq!(read(&mut raw, "w", "reader:1", 3, 0, 1)[0], 0);
    assert_eq!(write(&mut raw, "w", "writer:2", 4, 0, 1, 10_000)[0], 0);
    assert_eq!(
        write(&mut raw, "w", "writer:1", 9, 0, 1, 10_000),
        [1, fence, 1],
        "the resend took the lock again"
    );
    assert_eq!(
        fence_counter(&mut raw, "w"),
        fence.unsigned_abs(),
        "one fencing token issued"
    );
    let rwait: Option<String> = redis::cmd("HGET")
        .arg(rw_key("w", "write"))
        .arg("rwait")
        .query(&mut raw)
        .unwrap();
    assert_eq!(
        rwait.as_deref(),
        Some("1"),
        "the refused reader is still owed a wake-up"
    );
    assert_eq!(
        release_write(&mut raw, "w", "writer:1", fence.unsigned_abs(), 0),
        0
    );
    assert_eq!(
        llen(&mut raw, &rw_key("w", "rbaton")),
        1,
        "readers are woken"
    );
    assert_eq!(
        llen(&mut raw, &rw_key("w", "wbaton")),
        1,
        "the other writer is woken"
    );
}

#[test]
fn every_release_sent_twice_releases_once_whatever_came_in_between() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let name = "rel";
    // An inner read release sent twice takes off one level.
    assert_eq!(read(&mut raw, name, "reader:1", 3, 0, 1), [1, 3, 1]);
    assert_eq!(read(&mut raw, name, "reader:1", 4, 3, 2), [1, 3, 2]);
    for _ in 0..2 {
        assert_eq!(release_read(&mut raw, name, "reader:1", 3, 1), 1);
    }
    assert!(
        rw_state(&mut raw, name)[2].contains("1:3"),
        "{:?}",
        rw_state(&mut raw, name)
    );
    // The last read release sent twice, another reader entering between:
    // the resend changes nothing.
    assert_eq!(release_read(&mut raw, name, "reader:1", 3, 0), 0);
    assert_eq!(read(&mut raw, name, "reader:2", 5, 0, 1), [1, 5, 1]);
    let between = rw_state(&mut raw, name);
    assert_eq!(release_read(&mut raw, name, "reader:1", 3, 0), -1);
    assert_eq!(rw_state(&mut raw, name), between);
    assert_eq!(release_read(&mut raw, name, "reader:2", 5, 0), 0);

    // An inner write release sent twice takes off one level.
    let fence = write(&mut raw, name, "writer:1", 6, 0, 1, 0)[1].unsigned_abs();
    assert_eq!(
        write(&mut raw, name, "writer:1", 7, fence, 2, 0),
        [1, fence as i64, 2]
    );
    for _ in 0..2 {
        assert_eq!(release_write(&mut raw, name, "writer:1", fence, 1), 1);
    }
    let count: u64 = redis::cmd("HGET")
        .arg(rw_key(name, "write"))
        .arg("count")
        .query(&mut raw)
        .unwrap();
    assert_eq!(count, 1);
    // The last write release sent twice, another writer taking the lock
    // between: the resend leaves the new hold alone.
    assert_eq!(release_write(&mut raw, name, "writer:1", fence, 0), 0);
    let next = write(&mut raw, name, "writer:2", 8, 0, 1, 0);
    assert_eq!(next[0], 1);
    let between = rw_state(&mut raw, name);
    assert_eq!(release_write(&mut raw, name, "writer:1", fence, 0), -1);
    assert_eq!(
        rw_state(&mut raw, name),
        between,
        "the resend freed another's hold"
    );
}

/// A client that reaches `server` through `proxy`, its identity and
/// scripts warmed up so that the next script call is the one under test.
fn warmed_client(proxy: &FaultProxy, name: &str) -> Client {
    let client = Client::builder(proxy.url())
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = client.rw_lock(name).unwrap();
    lock.try_read().unwrap().expect("free").unlock().unwrap();
    lock.try_write().unwrap().expect("free").unlock().unwrap();
    client
}

#[test]
fn a_read_whose_reply_was_lost_gets_its_guard_though_a_writer_queued_before_the_resend() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = warmed_client(&proxy, "lost-read");
    let mut raw = server.connection();
    // Requests through the proxy take 300 ms: room for another client's
    // request between the first run and the resend.
    proxy.set_delay(Duration::from_millis(300));
    proxy.drop_reply_to(b"EVALSHA");
    let (release, released) = mpsc::channel::<()>();
    let reader = thread::spawn(move || {
        let lock = client.rw_lock("lost-read").unwrap();
        let guard = lock.try_read().unwrap();
        let got = guard.is_some();
        released.recv_timeout(Duration::from_secs(30)).unwrap();
        (got, guard.map(|g| g.unlock()))
    });
    eventually(
        Duration::from_secs(10),
        "the first read's reply lost",
        || proxy.dropped_replies() == 1,
    );
    let queued = write(&mut raw, "lost-read", "writer:1", 1, 0, 1, 10_000);
    assert_eq!(queued[0], 0, "the first run took a read hold");
    release.send(()).unwrap();
    let (got, unlocked) = reader.joined();
    assert!(
        got,
        "the resend was refused: {:?}",
        rw_state(&mut raw, "lost-read")
    );
    unlocked.unwrap().unwrap();
    proxy.set_delay(Duration::ZERO);
    // No hold left behind: the queued writer gets in at once.
    assert_eq!(
        write(&mut raw, "lost-read", "writer:1", 2, 0, 1, 10_000)[0],
        1
    );
}

#[test]
fn a_write_whose_reply_was_lost_keeps_the_fencing_token_of_its_first_run() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = warmed_client(&proxy, "lost-write");
    let mut raw = server.connection();
    // 300 ms per request through the proxy: time to read what the first
    // run stored before the resend arrives.
    proxy.set_delay(Duration::from_millis(300));
    proxy.drop_reply_to(b"EVALSHA");
    let writer = thread::spawn(move || {
        let lock = client.rw_lock("lost-write").unwrap();
        let guard = lock
            .try_write()
            .unwrap()
            .expect("the resend finds its own hold");
        let token = guard.fencing_token();
        guard.unlock().unwrap();
        token
    });
    eventually(
        Duration::from_secs(10),
        "the first write's reply lost",
        || proxy.dropped_replies() == 1,
    );
    let first: u64 = redis::cmd("HGET")
        .arg(rw_key("lost-write", "write"))
        .arg("fence")
        .query(&mut raw)
        .unwrap();
    let token = writer.joined();
    proxy.set_delay(Duration::ZERO);
    assert_eq!(
        token, first,
        "the resend took the lock afresh under a second token"
    );
    assert_eq!(
        fence_counter(&mut raw, "lost-write"),
        first,
        "a second token was issued"
    );
    let other = Client::open(&server.url()).unwrap();
    let read = other.rw_lock("lost-write").unwrap().try_read().unwrap();
    read.expect("free").unlock().unwrap();
}

#[test]
fn releases_whose_reply_was_lost_succeed_once_and_leave_a_later_holder_alone() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = warmed_client(&proxy, "lost-release");
    let lock = client.rw_lock("lost-release").unwrap();
    let mut raw = server.connection();

    // A read release and a write release, each losing its reply: the
    // resend finds nothing to release and reports success.
    let read = lock.try_read().unwrap().expect("free");
    proxy.drop_reply_to(b"EVALSHA");
    read.unlock().expect("released by the first run");
    let write = lock
        .try_write()
        .unwrap()
        .expect("free: the read hold ended");
    proxy.drop_reply_to(b"EVALSHA");
    write.unlock().expect("released by the first run");
    assert_eq!(proxy.dropped_replies(), 2);

    // The last write release losing its reply while another client's
    // writer takes the lock before the resend arrives.
    let other = Client::open(&server.url()).unwrap();
    let other_lock = other.rw_lock("lost-release").unwrap();
    let (go, wait_go) = mpsc::channel::<()>();
    let (held, wait_held) = mpsc::channel::<()>();
    let releaser = thread::spawn(move || {
        let guard = lock.try_write().unwrap().expect("free");
        held.send(()).unwrap();
        wait_go.recv_timeout(Duration::from_secs(30)).unwrap();
        guard.unlock()
    });
    wait_held.recv_timeout(Duration::from_secs(10)).unwrap();
    proxy.set_delay(Duration::from_millis(300));
    proxy.drop_reply_to(b"EVALSHA");
    go.send(()).unwrap();
    eventually(Duration::from_secs(10), "the release's reply lost", || {
        proxy.dropped_replies() == 3
    });
    let taken = other_lock
        .try_write()
        .unwrap()
        .expect("the first run released");
    let held = rw_state(&mut raw, "lost-release");
    releaser.joined().expect("the resend reports the release");
    assert_eq!(
        rw_state(&mut raw, "lost-release"),
        held,
        "the resend freed the new holder's hold"
    );
    proxy.set_delay(Duration::ZERO);
    assert!(!taken.is_lost());
    taken
        .unlock()
        .expect("the resend left the new holder's hold alone");
    assert_eq!(rw_state(&mut raw, "lost-release")[0], "write []");
}

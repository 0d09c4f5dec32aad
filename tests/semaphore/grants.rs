//! Grants (the semaphore's `release.lua`): a release whose freed permits
//! serve a waiter of another process parked on its client's hub grants
//! them to it (under the permit id its last attempt would have had) and
//! tells its client, instead of pushing a token for it to try again.
//! First one script run at a time (waiters named `<client>:<n>`, as the
//! crate names its threads), then through clients.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

use crate::resends::{ACQUIRE, RELEASE};
use crate::sem_keys;
use crate::support::{self, eventually, JoinWithin};

/// The clients' grant channels under the default prefix.
const GRANT_CHANNELS: &str = "redbaton:grant:";

/// The lease a waiter here asks a grant for.
const GRANT_MS: u64 = 2_000;

/// The seven keys of semaphore `name` a granting release takes: the six,
/// then the grant specs.
fn keys(name: &str) -> Vec<String> {
    let mut keys = sem_keys(name).to_vec();
    keys.push(format!(
        "redbaton:{{{}}}:sem:grants",
        support::hash_tag(name)
    ));
    keys
}

/// Runs acquire.lua for `id` (`<identity>:<request>`) wanting one permit;
/// `place` and `spec` for a waiter (the spec: `<request> <grant lease>`).
fn acquire(
    raw: &mut redis::Connection,
    name: &str,
    id: &str,
    place: &str,
    spec: Option<&str>,
) -> Vec<i64> {
    acquire_reserving(raw, name, id, place, spec, 0)
}

/// [`acquire`] from a waiter that holds newcomers back for `reserve_ms`
/// (0: not).
fn acquire_reserving(
    raw: &mut redis::Connection,
    name: &str,
    id: &str,
    place: &str,
    spec: Option<&str>,
    reserve_ms: u64,
) -> Vec<i64> {
    let keys = keys(name);
    let script = redis::Script::new(ACQUIRE);
    let mut call = script.prepare_invoke();
    for key in &keys[..6] {
        call.key(key);
    }
    call.arg(id)
        .arg(1)
        .arg(30_000)
        .arg(place)
        .arg(60_000)
        .arg(5_000)
        .arg(reserve_ms)
        .arg(0);
    if let Some(spec) = spec {
        call.key(&keys[6]).arg(spec);
    }
    call.invoke(raw).unwrap()
}

/// Runs release.lua for `id`, granting on the default channels.
fn release(raw: &mut redis::Connection, name: &str, id: &str) -> Vec<i64> {
    let script = redis::Script::new(RELEASE);
    let mut call = script.prepare_invoke();
    for key in keys(name) {
        call.key(key);
    }
    call.arg(id).arg(5_000).arg(GRANT_CHANNELS);
    call.invoke(raw).unwrap()
}

/// The server's clock, in ms.
fn server_ms(raw: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(raw).unwrap();
    secs * 1000 + micros / 1000
}

/// Semaphore `name` of one permit, held by `a:1` (request 1); `b:1` waits
/// for it (request 7), asking for a grant.
fn held_with_a_waiter(server: &RedisServer, raw: &mut redis::Connection, name: &str) {
    let client = support::client(server);
    assert_eq!(
        client.semaphore(name).unwrap().try_set_permits(1).unwrap(),
        1
    );
    assert_eq!(acquire(raw, name, "a:1:1", "", None), [1, 1]);
    let short = acquire(raw, name, "b:1:7", "1:b:1", Some("7 2000"));
    assert_eq!(short[..2], [0, 0], "{short:?}");
    let spec: Option<String> = redis::cmd("HGET")
        .arg(&keys(name)[6])
        .arg("1:b:1")
        .query(raw)
        .unwrap();
    // Parked on the shared baton.
    assert_eq!(spec.as_deref(), Some("7 2000 b"));
}

#[test]
fn a_release_grants_the_permit_to_the_waiter_whose_client_hears_it() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    held_with_a_waiter(&server, &mut raw, "granted");
    let listener = redis::Client::open(server.url()).unwrap();
    let mut subscriber = listener.get_connection().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}b")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let before = server_ms(&mut raw);
    assert_eq!(release(&mut raw, "granted", "a:1:1"), [1, 1]);
    let after = server_ms(&mut raw);
    let [state, holders, counts, waiters, baton, _] = sem_keys("granted");
    // b:1 holds it under the id of the request its park follows, for the
    // grant's lease.
    let ends: Option<i64> = redis::cmd("ZSCORE")
        .arg(&holders)
        .arg("b:1:7")
        .query(&mut raw)
        .unwrap();
    let ends = ends.expect("b:1:7 holds a permit");
    assert!(
        ends >= before + GRANT_MS as i64 && ends <= after + GRANT_MS as i64,
        "{ends} for a grant between {before} and {after}"
    );
    let count: Option<String> = redis::cmd("HGET")
        .arg(&counts)
        .arg("b:1:7")
        .query(&mut raw)
        .unwrap();
    assert_eq!(count.as_deref(), Some("1"));
    let used: Option<String> = redis::cmd("HGET")
        .arg(&state)
        .arg("used")
        .query(&mut raw)
        .unwrap();
    assert_eq!(used.as_deref(), Some("1"));
    // Its place and spec are gone, and no token was pushed.
    let place: Option<i64> = redis::cmd("ZSCORE")
        .arg(&waiters)
        .arg("1:b:1")
        .query(&mut raw)
        .unwrap();
    assert_eq!(place, None);
    let spec: Option<String> = redis::cmd("HGET")
        .arg(&keys("granted")[6])
        .arg("1:b:1")
        .query(&mut raw)
        .unwrap();
    assert_eq!(spec, None);
    let tokens: i64 = redis::cmd("LLEN").arg(&baton).query(&mut raw).unwrap();
    assert_eq!(tokens, 0);
    let message: Vec<u8> = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(
        String::from_utf8(message).unwrap(),
        format!("b:1 7 0 {ends} {} {state}{baton}", state.len())
    );
}

/// An attempt of the waiter sent again after its reply was lost, which
/// finds the permits of its own request granted meanwhile, takes them
/// (their lease moves on from the grant's); the give-back of that grant
/// by the waiter's client, which names the grant's end, then leaves them.
#[test]
fn a_grant_taken_by_the_waiters_resent_attempt_is_not_given_back() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    held_with_a_waiter(&server, &mut raw, "resent");
    assert_eq!(release(&mut raw, "resent", "a:1:1"), [1, 1]);
    let holders = sem_keys("resent")[1].clone();
    let ends = |raw: &mut redis::Connection| -> Option<i64> {
        redis::cmd("ZSCORE")
            .arg(&holders)
            .arg("b:1:7")
            .query(raw)
            .unwrap()
    };
    // Nobody heard the grant here (no subscriber): grant it by hand, as a
    // heard one writes it.
    let granted = server_ms(&mut raw) + GRANT_MS as i64;
    let _: () = redis::cmd("ZADD")
        .arg(&holders)
        .arg(granted)
        .arg("b:1:7")
        .query(&mut raw)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&sem_keys("resent")[2])
        .arg("b:1:7")
        .arg(1)
        .query(&mut raw)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&sem_keys("resent")[0])
        .arg("used")
        .arg(1)
        .query(&mut raw)
        .unwrap();
    // The resent attempt: the same id.
    assert_eq!(
        acquire(&mut raw, "resent", "b:1:7", "1:b:1", Some("7 2000")),
        [1, 1]
    );
    let taken = ends(&mut raw).unwrap();
    assert!(taken > granted, "{taken} after the grant's {granted}");
    // The give-back names the grant's end: nothing released.
    let script = redis::Script::new(RELEASE);
    let mut give_back = script.prepare_invoke();
    for key in keys("resent") {
        give_back.key(key);
    }
    give_back
        .arg("b:1:7")
        .arg(5_000)
        .arg(GRANT_CHANNELS)
        .arg(granted);
    let given: Vec<i64> = give_back.invoke(&mut raw).unwrap();
    assert_eq!(given, [0]);
    assert_eq!(ends(&mut raw), Some(taken), "still the waiter's");
    // Named with the end it has, it would have been released.
    let mut release_now = script.prepare_invoke();
    for key in keys("resent") {
        release_now.key(key);
    }
    release_now
        .arg("b:1:7")
        .arg(5_000)
        .arg(GRANT_CHANNELS)
        .arg(taken);
    assert_eq!(release_now.invoke::<Vec<i64>>(&mut raw).unwrap(), [1, 1]);
}

/// The waiter that holds newcomers back parks on the reserved baton: its
/// spec says so, its grant names that list, and the grant ends its
/// reservation.
#[test]
fn the_reserving_waiter_is_granted_on_its_own_list() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let client = support::client(&server);
    let sem = client.semaphore("reserved").unwrap();
    assert_eq!(sem.try_set_permits(1).unwrap(), 1);
    assert_eq!(acquire(&mut raw, "reserved", "a:1:1", "", None), [1, 1]);
    let short = acquire_reserving(
        &mut raw,
        "reserved",
        "c:1:5",
        "1:c:1",
        Some("5 2000"),
        60_000,
    );
    assert_eq!(short, [0, 0, short[2], 1, 0], "reserving");
    let grants_key = keys("reserved")[6].clone();
    let spec: Option<String> = redis::cmd("HGET")
        .arg(&grants_key)
        .arg("1:c:1")
        .query(&mut raw)
        .unwrap();
    assert_eq!(spec.as_deref(), Some("5 2000 r"));
    let listener = redis::Client::open(server.url()).unwrap();
    let mut subscriber = listener.get_connection().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}c")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(release(&mut raw, "reserved", "a:1:1"), [1, 1]);
    let [state, holders, _, _, _, reserved_baton] = sem_keys("reserved");
    let ends: Option<i64> = redis::cmd("ZSCORE")
        .arg(&holders)
        .arg("c:1:5")
        .query(&mut raw)
        .unwrap();
    let ends = ends.expect("c:1:5 holds the permit");
    let message: Vec<u8> = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(
        String::from_utf8(message).unwrap(),
        format!("c:1 5 0 {ends} {} {state}{reserved_baton}", state.len())
    );
    let reserved: Option<String> = redis::cmd("HGET")
        .arg(&state)
        .arg("reserved")
        .query(&mut raw)
        .unwrap();
    assert_eq!(reserved, None, "served: it holds nobody back");
    let tokens: i64 = redis::cmd("LLEN")
        .arg(&reserved_baton)
        .query(&mut raw)
        .unwrap();
    assert_eq!(tokens, 0);
}

#[test]
fn a_grant_nobody_hears_pushes_a_token_instead() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    held_with_a_waiter(&server, &mut raw, "unheard");
    assert_eq!(release(&mut raw, "unheard", "a:1:1"), [1, 1]);
    let [_, holders, _, waiters, baton, _] = sem_keys("unheard");
    let held: i64 = redis::cmd("ZCARD").arg(&holders).query(&mut raw).unwrap();
    assert_eq!(held, 0, "nothing granted");
    let tokens: i64 = redis::cmd("LLEN").arg(&baton).query(&mut raw).unwrap();
    assert_eq!(tokens, 1, "a token for the waiter");
    let place: Option<i64> = redis::cmd("ZSCORE")
        .arg(&waiters)
        .arg("1:b:1")
        .query(&mut raw)
        .unwrap();
    assert!(place.is_some(), "its place kept");
}

/// Semaphore `name` of one permit, held through a client of `server`:
/// the holder's handle, its permit, and a handle of another client whose
/// waiters park 30 s (handles keep their clients' state alive).
fn one_permit_held(
    server: &RedisServer,
    name: &str,
) -> (
    redbaton::Semaphore,
    redbaton::SemaphorePermit,
    redbaton::Semaphore,
) {
    let holder = support::client(server);
    let waiting = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let sem = holder.semaphore(name).unwrap();
    sem.try_set_permits(1).unwrap();
    let held = sem.acquire().unwrap();
    (sem, held, waiting.semaphore(name).unwrap())
}

/// A waiter of another client parked on its hub wakes holding the permit:
/// the holder's release and the waiter's own, one `PUBLISH`, no token
/// pushed or popped.
#[test]
fn a_waiter_of_another_client_is_granted_the_permit_without_an_attempt() {
    let server = RedisServer::start();
    let (sem, held, other) = one_permit_held(&server, "handed");
    let wait = move || {
        let permit = other
            .try_acquire_for(Duration::from_secs(20))
            .unwrap()
            .expect("granted");
        permit.release().unwrap();
    };
    let used = support::hand_off_commands(&server, wait, || held.release().unwrap());
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_eq!(used.get("rpush"), None, "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    assert_eq!(sem.available_permits().unwrap(), 1);
}

/// A grant that comes long after the attempt its waiter's park followed
/// (here: 800 ms of a hold, past a quarter of the grant's lease) is
/// confirmed by one renewal and taken: the holder's release, the renewal
/// and the waiter's own release, where giving it back and asking again
/// would cost two scripts more.
#[test]
fn a_late_grant_is_renewed_and_taken() {
    let server = RedisServer::start();
    let (sem, held, other) = one_permit_held(&server, "late");
    // No attempt of its own during the hold: it does not hold newcomers
    // back (which takes one).
    let other = other.hold_back_after(Duration::from_secs(60));
    let wait = move || {
        let permit = other
            .try_acquire_for(Duration::from_secs(20))
            .unwrap()
            .expect("granted");
        permit.release().unwrap();
    };
    let used = support::hand_off_commands(&server, wait, || {
        // The hold this test is about, not a wait for another thread.
        thread::sleep(Duration::from_millis(800));
        held.release().unwrap()
    });
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(support::scripts_run(&used), 3, "{used:?}");
    assert_eq!(used.get("rpush"), None, "{used:?}");
    assert_eq!(sem.available_permits().unwrap(), 1);
}

/// A granted permit outlives the grant's short lease: its client's
/// watchdog lengthens it to the waiter's own (30 s) at once, and the
/// waiter keeps it past the grant's end.
#[test]
fn a_granted_permit_is_lengthened_to_the_waiters_own_lease() {
    let server = RedisServer::start();
    let (_sem, held, other) = one_permit_held(&server, "lengthened");
    let (tell, told) = mpsc::channel();
    let (go, may_go) = mpsc::channel::<()>();
    let waiter = thread::spawn(move || {
        let permit = other
            .try_acquire_for(Duration::from_secs(20))
            .unwrap()
            .expect("granted");
        tell.send(Instant::now()).unwrap();
        may_go.recv().unwrap();
        permit.release()
    });
    let grants_key = keys("lengthened")[6].clone();
    let mut raw = server.connection();
    eventually(Duration::from_secs(10), "the waiter parked", || {
        let specs: i64 = redis::cmd("HLEN").arg(&grants_key).query(&mut raw).unwrap();
        support::parked(&server) == 1 && specs == 1
    });
    let before = server.command_calls();
    held.release().unwrap();
    let granted = told.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(server.commands_since(&before).get("publish"), Some(&1));
    let holders = sem_keys("lengthened")[1].clone();
    let lease_left = |raw: &mut redis::Connection| -> i64 {
        let ends: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(&holders)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query(raw)
            .unwrap();
        ends[0].1 - server_ms(raw)
    };
    eventually(Duration::from_secs(5), "lengthened", || {
        lease_left(&mut raw) > GRANT_MS as i64
    });
    let lengthened = granted.elapsed();
    assert!(
        lengthened < Duration::from_millis(GRANT_MS / 2),
        "lengthened {lengthened:?} after the grant"
    );
    // Past the grant's end (the stretch this test is about, not a wait
    // for another thread): still its own.
    thread::sleep(Duration::from_millis(GRANT_MS + 500).saturating_sub(granted.elapsed()));
    assert!(lease_left(&mut raw) > GRANT_MS as i64);
    go.send(()).unwrap();
    assert!(waiter.joined().is_ok(), "kept past the grant's lease");
}

/// A thread of `waiting` waiting for semaphore "busy", whose one permit
/// `holder` takes: while it waits (parked, once `support::parked` counts
/// it), its client's hub listens on the client's grant channel. Release
/// the permit, then join the thread (served).
fn parked_elsewhere(
    holder: &Client,
    waiting: &Client,
) -> (redbaton::SemaphorePermit, thread::JoinHandle<()>) {
    let busy = holder.semaphore("busy").unwrap();
    busy.try_set_permits(1).unwrap();
    let held = busy.acquire().unwrap();
    let other = waiting.semaphore("busy").unwrap();
    let parked = thread::spawn(move || {
        other
            .try_acquire_for(Duration::from_secs(30))
            .unwrap()
            .expect("served")
            .release()
            .unwrap();
    });
    (held, parked)
}

/// A grant whose message finds no waiter parked for it (here: a request
/// no thread parks after, of a client whose hub listens because another
/// of its threads waits) is given back by the client at once, not kept
/// for the grant's lease.
#[test]
fn a_grant_no_parked_waiter_takes_is_given_back_at_once() {
    let server = RedisServer::start();
    let holder = support::client(&server);
    let listening = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let (busy_held, parked_waiter) = parked_elsewhere(&holder, &listening);
    let mut raw = server.connection();
    let busy_waiters = sem_keys("busy")[3].clone();
    let mut place = String::new();
    eventually(Duration::from_secs(10), "the busy waiter parked", || {
        let places: Vec<String> = redis::cmd("ZRANGE")
            .arg(&busy_waiters)
            .arg(0)
            .arg(-1)
            .query(&mut raw)
            .unwrap();
        place = places.first().cloned().unwrap_or_default();
        support::parked(&server) == 1 && !place.is_empty()
    });
    // `1:<client>:<thread>`: a thread of the same client, request 999999,
    // waits on "unclaimed" as far as the script knows.
    let client_id = place.split(':').nth(1).unwrap().to_owned();
    let waiter = format!("{client_id}:999");
    let sem = holder.semaphore("unclaimed").unwrap();
    sem.try_set_permits(1).unwrap();
    assert_eq!(acquire(&mut raw, "unclaimed", "a:1:1", "", None), [1, 1]);
    let id = format!("{waiter}:999999");
    let short = acquire(
        &mut raw,
        "unclaimed",
        &id,
        &format!("1:{waiter}"),
        Some("999999 60000"),
    );
    assert_eq!(short[..2], [0, 0]);
    let before = server.command_calls();
    let released = Instant::now();
    assert_eq!(release(&mut raw, "unclaimed", "a:1:1"), [1, 1]);
    eventually(Duration::from_secs(10), "the grant given back", || {
        sem.available_permits().unwrap() == 1
    });
    let given_back = released.elapsed();
    // Granted (heard), then released by the client: the release's script,
    // and the give-back's.
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert!(support::scripts_run(&used) >= 2, "{used:?}");
    assert!(
        given_back < Duration::from_secs(5),
        "given back {given_back:?} after the release (its lease: 60 s)"
    );
    busy_held.release().unwrap();
    parked_waiter.joined();
}

/// A grant that comes between a waiter's attempt and its park (the
/// attempt's reply is slow: a release granted it the permit meanwhile,
/// and the grant, finding it not parked yet, was given back): the waiter
/// parks on a grant that is gone, its place among the waiters with it.
/// Its hub remembers the grant given back and ends that park at once: the
/// waiter asks again and takes the free permit, rather than sleeping
/// through its park while others are granted the permits.
#[test]
fn a_waiter_whose_grant_came_before_it_parked_asks_again_at_once() {
    let server = RedisServer::start();
    let holder = support::client(&server);
    let proxy = testkit::FaultProxy::start(server.port());
    let waiting = Client::builder(proxy.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let (busy_held, parked_waiter) = parked_elsewhere(&holder, &waiting);
    eventually(Duration::from_secs(10), "the busy waiter parked", || {
        support::parked(&server) == 1
    });
    let sem = holder.semaphore("raced").unwrap();
    sem.try_set_permits(1).unwrap();
    let held = sem.acquire().unwrap();
    // The waiter's first attempt runs at once; its reply comes 1.5 s later.
    let reply_held = Duration::from_millis(1_500);
    proxy.hold_reply_to(b"{raced}", reply_held);
    // It reserves the permit from its first attempt on, and parks till the
    // holder's lease ends (as a waiter that has waited a while does),
    // rather than looking again at once to reserve.
    let raced = waiting
        .semaphore("raced")
        .unwrap()
        .hold_back_after(Duration::ZERO);
    let (acquired, got) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let permit = raced.try_acquire_for(Duration::from_secs(20)).unwrap();
        acquired.send(Instant::now()).unwrap();
        permit.expect("served").release().unwrap();
    });
    let mut raw = server.connection();
    let specs = keys("raced")[6].clone();
    eventually(Duration::from_secs(10), "the waiter's attempt ran", || {
        let specs: i64 = redis::cmd("HLEN").arg(&specs).query(&mut raw).unwrap();
        specs == 1
    });
    let released = Instant::now();
    held.release().unwrap();
    eventually(Duration::from_secs(10), "the grant given back", || {
        sem.available_permits().unwrap() == 1
    });
    assert!(
        released.elapsed() < reply_held,
        "given back before the waiter heard its attempt's reply"
    );
    let acquired_at = got
        .recv_timeout(Duration::from_secs(25))
        .expect("the waiter ended");
    let waited = acquired_at - released;
    assert!(
        waited < reply_held + Duration::from_secs(3),
        "served {waited:?} after the release (its reply came {reply_held:?} after it)"
    );
    waiter.joined();
    busy_held.release().unwrap();
    parked_waiter.joined();
}

//! Grants (`lib/grant.lua`, `backend::grants`): a release that would open
//! a hand-over window for a waiter parked on its client's hub writes that
//! waiter's ownership and tells its client instead. First one script run
//! at a time (each client's threads named `<client>:<n>`, as the crate
//! names them), then what can go wrong on the way: a message nobody takes,
//! a message lost, a granted process that stops.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

use crate::scripts::{
    fence_key, field, release, script, take, tokens, BATON_TTL_MS, FENCE_TTL_MS, GRANT_CHANNELS,
    LEASE_MS,
};
use crate::support::{self, baton_key, eventually, lock_key, spawn_child, JoinWithin};

/// The lease a waiter here asks a grant for.
const GRANT_MS: u64 = 2_000;

/// How long a waiter here has been asking, in µs.
const LONG: i64 = 60_000_000;

/// An attempt of `id` on `name` that found it held (a waiter that has
/// been asking `asking` µs), request `request`, which may be granted the
/// lock for `grant_ms` ("0": not) with `reserve` tokens set aside.
fn mark(
    raw: &mut redis::Connection,
    name: &str,
    id: &str,
    asking: i64,
    request: u64,
    grant_ms: u64,
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
        .arg(request)
        .arg(asking)
        .arg(0)
        .arg(3)
        .arg(0)
        .arg("2")
        .arg(BATON_TTL_MS)
        .arg(grant_ms)
        .invoke(raw)
        .unwrap()
}

#[test]
fn a_release_grants_the_marked_waiter_whose_client_hears_it() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let listener = redis::Client::open(server.url()).unwrap();
    let mut subscriber = listener.get_connection().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}b")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let fence = take(&mut raw, "granted", "a:1");
    assert_eq!(mark(&mut raw, "granted", "b:1", LONG, 7, GRANT_MS)[0], 0);
    assert_eq!(
        field(&mut raw, "granted", "grant").as_deref(),
        Some("7 2000 3")
    );
    release(&mut raw, "granted", "a:1", fence, true);
    // b:1 holds it, under a token above a:1's, for the grant's lease.
    assert_eq!(field(&mut raw, "granted", "flag").as_deref(), Some("b:1"));
    let token: i64 = field(&mut raw, "granted", "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert!(token > fence, "{token} after {fence}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key("granted"))
        .query(&mut raw)
        .unwrap();
    assert!(pttl > 0 && pttl <= GRANT_MS as i64, "{pttl}");
    // Its process's hand-offs in memory are numbered above: the counter
    // is left at token + reserve.
    let counter: i64 = redis::cmd("GET")
        .arg(fence_key("granted"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(counter, token + 3);
    // No window, no baton: the others wake at the grantee's release.
    assert_eq!(field(&mut raw, "granted", "handover"), None);
    assert_eq!(field(&mut raw, "granted", "grant"), None);
    assert_eq!(field(&mut raw, "granted", "waited").as_deref(), Some("1"));
    assert_eq!(tokens(&mut raw, "granted"), 0);
    let message: Vec<u8> = pubsub.get_message().unwrap().get_payload().unwrap();
    let (key, baton) = (lock_key("granted"), baton_key("granted"));
    assert_eq!(
        String::from_utf8(message).unwrap(),
        format!("b:1 7 {token} ; {} {key}{baton}", key.len())
    );
}

#[test]
fn a_grant_nobody_hears_opens_the_window_instead() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "unheard", "a:1");
    assert_eq!(mark(&mut raw, "unheard", "b:1", LONG, 7, GRANT_MS)[0], 0);
    release(&mut raw, "unheard", "a:1", fence, true);
    assert_eq!(field(&mut raw, "unheard", "flag"), None);
    assert_eq!(field(&mut raw, "unheard", "for").as_deref(), Some("b:1"));
    assert!(field(&mut raw, "unheard", "handover").is_some());
    assert_eq!(tokens(&mut raw, "unheard"), 1);
}

#[test]
fn the_mark_names_the_marked_waiters_latest_request_and_no_one_elses_grant() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    take(&mut raw, "marks", "a:1");
    assert_eq!(mark(&mut raw, "marks", "b:1", LONG, 7, GRANT_MS)[0], 0);
    // The same waiter again, a little later by its clock: its newest
    // request is the one its park follows.
    assert_eq!(mark(&mut raw, "marks", "b:1", LONG - 5, 9, GRANT_MS)[0], 0);
    assert_eq!(
        field(&mut raw, "marks", "grant").as_deref(),
        Some("9 2000 3")
    );
    // A waiter asking for less leaves the mark alone.
    assert_eq!(mark(&mut raw, "marks", "c:1", LONG / 2, 3, GRANT_MS)[0], 0);
    assert_eq!(field(&mut raw, "marks", "queued").as_deref(), Some("b:1"));
    assert_eq!(
        field(&mut raw, "marks", "grant").as_deref(),
        Some("9 2000 3")
    );
    // One asking longer that cannot be granted takes the mark, and no
    // grant of b:1's is left to name it.
    assert_eq!(mark(&mut raw, "marks", "d:1", LONG * 2, 4, 0)[0], 0);
    assert_eq!(field(&mut raw, "marks", "queued").as_deref(), Some("d:1"));
    assert_eq!(field(&mut raw, "marks", "grant"), None);
}

#[test]
fn a_waiter_that_stops_waiting_takes_its_grant_off_and_no_one_elses() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    take(&mut raw, "withdrawn", "a:1");
    assert_eq!(mark(&mut raw, "withdrawn", "b:1", LONG, 7, GRANT_MS)[0], 0);
    let withdraw = |raw: &mut redis::Connection, id: &str| -> i64 {
        script("withdraw")
            .key(lock_key("withdrawn"))
            .arg(id)
            .invoke(raw)
            .unwrap()
    };
    assert_eq!(withdraw(&mut raw, "c:1"), 0);
    assert!(field(&mut raw, "withdrawn", "grant").is_some());
    assert_eq!(withdraw(&mut raw, "b:1"), 1);
    assert_eq!(field(&mut raw, "withdrawn", "grant"), None);
    // Still marked: its release wakes it (a window), as for any waiter.
    assert_eq!(
        field(&mut raw, "withdrawn", "queued").as_deref(),
        Some("b:1")
    );
}

/// A client whose hub's listener has subscribed (one of its waiters was
/// granted a lock), and the id its threads' identities start with.
fn a_listening_client(server: &RedisServer) -> (Client, String) {
    let holder = support::client(server);
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.lock("first").unwrap().lock().unwrap();
    let lock = client.lock("first").unwrap();
    let waiter = thread::spawn(move || {
        let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
        let owner = lock.holder().unwrap().expect("granted").owner;
        drop(guard);
        owner.as_str().to_owned()
    });
    let mut raw = server.connection();
    eventually(
        Duration::from_secs(10),
        "the waiter marked and parked",
        || support::parked(server) == 1 && field(&mut raw, "first", "grant").is_some(),
    );
    held.unlock().unwrap();
    let owner = waiter.joined();
    let id = owner.split(':').next().unwrap().to_owned();
    (client, id)
}

/// A grant whose message finds no waiter parked (here: a request no
/// thread parks after) is given back by the client at once, not kept for
/// the grant's lease.
#[test]
fn a_grant_no_parked_waiter_takes_is_given_back_at_once() {
    let server = RedisServer::start();
    let (_client, id) = a_listening_client(&server);
    let mut raw = server.connection();
    let fence = take(&mut raw, "unclaimed", "a:1");
    let waiter = format!("{id}:999");
    assert_eq!(
        mark(&mut raw, "unclaimed", &waiter, LONG, 999_999, 60_000)[0],
        0
    );
    let before = server.command_calls();
    let released = Instant::now();
    release(&mut raw, "unclaimed", "a:1", fence, true);
    eventually(Duration::from_secs(10), "the grant given back", || {
        field(&mut raw, "unclaimed", "flag").is_none()
    });
    let given_back = released.elapsed();
    // Granted (heard, no window), then released by the client: the
    // release's script, and the give-back's.
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_eq!(field(&mut raw, "unclaimed", "handover"), None);
    assert!(
        given_back < Duration::from_secs(5),
        "given back {given_back:?} after the release (its lease: 60 s)"
    );
}

/// A give-back whose reply is slow (a slow network on the way back) is
/// waited for off the client's listener: meanwhile the listener hears the
/// grants to the client's other waiters, which take their locks at once,
/// not after the give-back's round trip.
#[test]
fn a_slow_give_back_keeps_no_other_grant_of_its_client_waiting() {
    let server = RedisServer::start();
    let proxy = testkit::FaultProxy::start(server.port());
    let holder = support::client(&server);
    let client = Client::builder(proxy.url())
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.lock("second").unwrap().lock().unwrap();
    let lock = client.lock("second").unwrap();
    let (acquired, got) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let guard = lock.try_lock_for(Duration::from_secs(30)).unwrap();
        acquired.send(Instant::now()).unwrap();
        guard.expect("served").unlock().unwrap();
    });
    let mut raw = server.connection();
    eventually(
        Duration::from_secs(10),
        "the waiter marked and parked",
        || support::parked(&server) == 1 && field(&mut raw, "second", "grant").is_some(),
    );
    let queued = field(&mut raw, "second", "queued").expect("the waiter's place");
    let id = queued.split(':').next().unwrap().to_owned();
    let channel = format!("{GRANT_CHANNELS}{id}");
    eventually(Duration::from_secs(10), "the listener subscribed", || {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut raw)
            .unwrap();
        subscribers == 1
    });
    // A grant of "unclaimed" to a request of the client's that no thread
    // parks after: given back, which runs at once on the server, and whose
    // reply reaches the client 3 s later.
    let fence = take(&mut raw, "unclaimed", "a:1");
    let nobody = format!("{id}:999");
    assert_eq!(
        mark(&mut raw, "unclaimed", &nobody, LONG, 999_999, 60_000)[0],
        0
    );
    let reply_held = Duration::from_secs(3);
    proxy.hold_reply_to(b"{unclaimed}", reply_held);
    release(&mut raw, "unclaimed", "a:1", fence, true);
    eventually(Duration::from_secs(10), "the grant given back", || {
        field(&mut raw, "unclaimed", "flag").is_none()
    });
    let released = Instant::now();
    held.unlock().unwrap();
    let acquired_at = got
        .recv_timeout(Duration::from_secs(30))
        .expect("the waiter ended");
    let waited = acquired_at.saturating_duration_since(released);
    assert!(
        waited < Duration::from_secs(1),
        "served {waited:?} after the release, while a give-back's reply was held {reply_held:?}"
    );
    waiter.joined();
}

/// A grant whose message is lost (the listener's connection fails after
/// the release) still reaches its waiter: every waiter of that hub looks
/// again, and the waiter finds the lock under its own identity with no
/// guard of its own, a leftover it takes afresh, under a new token.
#[test]
fn a_waiter_whose_grant_message_was_lost_takes_the_lock_at_its_next_look() {
    let server = RedisServer::start();
    let holder = support::client(&server);
    let waiting = Client::builder(server.url())
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.lock("lost").unwrap().lock().unwrap();
    let lock = waiting.lock("lost").unwrap();
    let (tell, told) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("served");
        tell.send((Instant::now(), guard.fencing_token())).unwrap();
    });
    let mut raw = server.connection();
    eventually(
        Duration::from_secs(10),
        "the waiter marked and parked",
        || support::parked(&server) == 1 && field(&mut raw, "lost", "grant").is_some(),
    );
    // What a granting release writes, with its message lost: the holder's
    // ownership goes, the waiter's comes, with a long lease.
    let waiter_id = field(&mut raw, "lost", "queued").unwrap();
    let granted: i64 = held.fencing_token() as i64 + 1;
    std::mem::forget(held);
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(lock_key("lost"))
        .cmd("HSET")
        .arg(lock_key("lost"))
        .arg("flag")
        .arg(&waiter_id)
        .arg("count")
        .arg(1)
        .arg("fence")
        .arg(granted)
        .arg("req")
        .arg("grant")
        .arg("waited")
        .arg(1)
        .cmd("PEXPIRE")
        .arg(lock_key("lost"))
        .arg(60_000)
        .query(&mut raw)
        .unwrap();
    let lost = Instant::now();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut raw).unwrap();
    let listener = list
        .lines()
        .find(|line| line.contains(" sub=2 "))
        .and_then(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .expect("the waiting client's listener")
        .to_owned();
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&listener)
        .query(&mut raw)
        .unwrap();
    let (served, token) = told
        .recv_timeout(Duration::from_secs(20))
        .expect("the waiter served");
    waiter.joined();
    let took = served.duration_since(lost);
    assert!(took < Duration::from_secs(5), "served {took:?} after");
    assert!(
        token > granted as u64,
        "a new token: {token} after {granted}"
    );
    drop(holder);
}

/// A granted waiter whose process stops before it reads the grant (its
/// connections stay open, so the server counts it as hearing) costs the
/// others the grant's lease (2 s), not the waiter's own (30 s).
#[test]
fn a_grant_to_a_stopped_process_costs_the_others_its_short_lease() {
    let server = RedisServer::start();
    let holder = support::client(&server);
    let held = holder.lock("busy").unwrap().lock().unwrap();
    let mut child = spawn_child("remote-waiter", &server);
    child.wait_for_line("READY", Duration::from_secs(30));
    let mut raw = server.connection();
    eventually(
        Duration::from_secs(10),
        "the child marked and parked",
        || support::parked(&server) == 1 && field(&mut raw, "busy", "grant").is_some(),
    );
    let marked = field(&mut raw, "busy", "queued");
    child.signal_stop();
    let other = support::client(&server);
    let lock = other.lock("busy").unwrap();
    // Asking for less time than the child: it parks behind the grant.
    let waiter = thread::spawn(move || {
        let asked = Instant::now();
        let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
        (guard.is_some(), asked.elapsed())
    });
    held.unlock().unwrap();
    assert_eq!(
        field(&mut raw, "busy", "flag"),
        marked,
        "granted to the child"
    );
    let (served, waited) = waiter.joined();
    child.signal_continue();
    child.kill();
    assert!(served, "the other waiter served");
    assert!(
        waited < Duration::from_secs(8),
        "served after {waited:?} (a grant's lease is 2 s, the child's own 30 s)"
    );
}

/// A client whose server refused it the parking hub parks its waiters in
/// `BLPOP`, where no grant reaches them: once it knows, its waiters are
/// not offered one, and a release wakes them with its baton, as before
/// grants (a grant nobody could take would cost the hand-off a token drawn
/// and a message nobody reads, or given back).
#[test]
fn a_waiter_parked_in_blpop_is_not_offered_a_grant() {
    let server = RedisServer::start();
    let url = testkit::untracked_user(&mut server.connection(), &server.url());
    let holder = support::client(&server);
    let waiting = Client::builder(url)
        .max_park(Duration::from_secs(60))
        .build()
        .unwrap();
    let lock = waiting.lock("blpop").unwrap();
    // The first park finds out that the hub is refused.
    drop(holder.lock("other").unwrap().lock().unwrap());
    let held = holder.lock("blpop").unwrap().lock().unwrap();
    let first = lock.clone();
    let waiter = thread::spawn(move || {
        first
            .try_lock_for(Duration::from_millis(200))
            .unwrap()
            .is_some()
    });
    assert!(!waiter.joined());
    held.unlock().unwrap();
    let held = holder.lock("blpop").unwrap().lock().unwrap();
    let used = support::hand_off_commands(
        &server,
        move || {
            let guard = lock.try_lock_for(Duration::from_secs(30)).unwrap();
            guard.expect("woken by the release").unlock().unwrap();
        },
        || held.unlock().unwrap(),
    );
    assert_eq!(used.get("publish"), None, "{used:?}");
}

/// A waiter of `waiting` (a client of another process, parking 60 s)
/// marked on `name`, held by a client of `server`, is granted it; `then`
/// runs just before the holder's release. Returns when it was granted,
/// the gate that lets it unlock, and its thread, which returns the
/// unlock's outcome.
fn granted_waiter(
    server: &RedisServer,
    name: &'static str,
    waiting: Client,
    then: impl FnOnce(),
) -> (
    Instant,
    mpsc::Sender<()>,
    thread::JoinHandle<Result<(), redbaton::Error>>,
) {
    let holder = support::client(server);
    let held = holder.lock(name).unwrap().lock().unwrap();
    let lock = waiting.lock(name).unwrap();
    let (tell, told) = mpsc::channel();
    let (go, may_go) = mpsc::channel::<()>();
    let waiter = thread::spawn(move || {
        let guard = lock
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .expect("granted");
        tell.send(Instant::now()).unwrap();
        may_go.recv().unwrap();
        guard.unlock()
    });
    let mut raw = server.connection();
    eventually(Duration::from_secs(10), "the waiter marked", || {
        support::parked(server) == 1 && field(&mut raw, name, "grant").is_some()
    });
    let before = server.command_calls();
    then();
    held.unlock().unwrap();
    let granted = told.recv_timeout(Duration::from_secs(20)).unwrap();
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "granted: {used:?}");
    (granted, go, waiter)
}

/// A client whose waiters park 60 s.
fn waiting(url: &str) -> Client {
    waiting_builder(url).build().unwrap()
}

fn waiting_builder(url: &str) -> redbaton::ClientBuilder {
    Client::builder(url).max_park(Duration::from_secs(60))
}

/// A granted ownership outlives the grant's short lease: its client's
/// watchdog lengthens it to the waiter's own lease (30 s) at once (within
/// the grant's first half), and the waiter keeps it past the grant's end.
#[test]
fn a_granted_ownership_is_lengthened_to_the_waiters_own_lease() {
    let server = RedisServer::start();
    let (granted, go, waiter) =
        granted_waiter(&server, "lengthened", waiting(&server.url()), || {});
    let mut raw = server.connection();
    let pttl = |raw: &mut redis::Connection| -> i64 {
        redis::cmd("PTTL")
            .arg(lock_key("lengthened"))
            .query(raw)
            .unwrap()
    };
    eventually(Duration::from_secs(5), "lengthened", || {
        pttl(&mut raw) > GRANT_MS as i64
    });
    let lengthened = granted.elapsed();
    assert!(
        lengthened < Duration::from_millis(GRANT_MS / 2),
        "lengthened {lengthened:?} after the grant"
    );
    // Past the grant's end (the stretch this test is about, not a wait
    // for another thread): still its own.
    thread::sleep(Duration::from_millis(GRANT_MS + 500).saturating_sub(granted.elapsed()));
    assert!(pttl(&mut raw) > GRANT_MS as i64);
    go.send(()).unwrap();
    assert!(waiter.joined().is_ok(), "kept past the grant's lease");
}

/// A granted ownership whose first renewal goes unanswered is renewed
/// again before the grant's short lease ends: the watchdog gives up on
/// the round in time (not after the 3 s I/O timeout) and tries again by
/// what is left of the hold (not a second on, as for a 30 s lease).
#[test]
fn a_granted_ownership_whose_first_renewal_goes_unanswered_is_renewed_in_time() {
    let server = RedisServer::start();
    let proxy = testkit::FaultProxy::start(server.port());
    let (builder, renewal_failed) = support::telling_renewal_failures(
        waiting_builder(&proxy.url()).io_timeout(Duration::from_secs(3)),
    );
    let client = builder.build().unwrap();
    // Silent from before the grant: its first renewal, sent at once, is
    // never answered (the grant itself comes over the client's
    // subscription, which the proxy still passes on).
    let (granted, go, waiter) =
        granted_waiter(&server, "unanswered", client, || proxy.set_silent(true));
    let given_up = renewal_failed
        .recv_timeout(Duration::from_secs(10))
        .expect("the unanswered renewal is reported");
    proxy.set_silent(false);
    let grant = Duration::from_millis(GRANT_MS);
    assert!(
        given_up < granted + grant,
        "given up on {:?} after the grant",
        given_up - granted
    );
    let mut raw = server.connection();
    eventually(grant, "renewed", || {
        redis::cmd("PTTL")
            .arg(lock_key("unanswered"))
            .query::<i64>(&mut raw)
            .unwrap()
            > GRANT_MS as i64
    });
    // Past the grant's end (the stretch this test is about): still its own.
    thread::sleep(
        (granted + grant + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
    );
    go.send(()).unwrap();
    assert!(waiter.joined().is_ok(), "kept past the grant's lease");
}

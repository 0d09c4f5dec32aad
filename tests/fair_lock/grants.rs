//! Grants of the fair lock (`fair/release.lua`, `lib/grant.lua`): a last
//! release that would wake the guessed head of the queue, a waiter of
//! another client whose attempts left a grant spec, writes that waiter's
//! ownership itself and tells its client, passing along the line of that
//! client's threads behind it.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

use crate::support::{self, JoinWithin};
use crate::{
    held_by_c1, patient, queue_key, queue_len, queued_in_turn, release_script, renewed_past_grant,
    unlocked, InTurnWaiter,
};

/// The prefix of the clients' grant channels (`<prefix>:grant:`).
const GRANT_CHANNELS: &str = "redbaton:grant:";
const FENCE_TTL_MS: u64 = 86_400_000;

fn lock_key(name: &str) -> String {
    format!("redbaton:{{{name}}}:fair:lock")
}

fn own_list(name: &str, waiter: &str) -> String {
    format!("redbaton:{{{name}}}:fair:wake:{waiter}")
}

fn spec_key(name: &str, waiter: &str) -> String {
    format!("{}:grant:{waiter}", lock_key(name))
}

/// The lock `name` held by `c:1` under token 10, asked for, with `g:1`,
/// `g:2` (threads of one client) and `r:9` queued in that order, and
/// `g:1`'s grant spec (request 7, a 2 s grant, up to 5 in its line).
fn held_with_three_waiters(con: &mut redis::Connection, name: &str) {
    held_by_c1(con, name, &[("g:1", 100), ("g:2", 200), ("r:9", 300)]);
    redis::cmd("SET")
        .arg(spec_key(name, "g:1"))
        .arg("7 2000 5")
        .query::<()>(con)
        .unwrap();
}

/// `c:1`'s last release of `name`, guessing `g:1` the head, with grants.
fn release_guessing_g1(con: &mut redis::Connection, name: &str) -> (i64, String, i64) {
    let lock = lock_key(name);
    release_script()
        .key(&lock)
        .key(queue_key(name))
        .key(format!("{lock}:places"))
        .key(format!("{lock}:next"))
        .key(format!("redbaton:{{{name}}}:fair:fence"))
        .key(own_list(name, "g:1"))
        .key(spec_key(name, "g:1"))
        .arg(&["c:1", "10", "0", "30000", "60000", "g:1"])
        .arg(FENCE_TTL_MS)
        .arg(GRANT_CHANNELS)
        .invoke(con)
        .unwrap()
}

fn field(con: &mut redis::Connection, name: &str, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(lock_key(name))
        .arg(field)
        .query(con)
        .unwrap()
}

fn place_end(con: &mut redis::Connection, name: &str, waiter: &str) -> f64 {
    redis::cmd("ZSCORE")
        .arg(format!("{}:places", lock_key(name)))
        .arg(waiter)
        .query(con)
        .unwrap()
}

fn list_len(con: &mut redis::Connection, list: &str) -> u64 {
    redis::cmd("LLEN").arg(list).query(con).unwrap()
}

fn server_ms(con: &mut redis::Connection) -> f64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    (secs * 1000 + micros / 1000) as f64
}

/// The release grants the guessed head whose client hears it: the head
/// holds the lock under a token above the holder's, for the grant's lease,
/// with tokens set aside for the line of its client's threads behind it,
/// which the message passes along with the waiter after them; the head's
/// place stays, ending with the grant's lease; no token is pushed.
#[test]
fn a_release_grants_the_guessed_head_and_passes_its_clients_line_along() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let listener = redis::Client::open(server.url()).unwrap();
    let mut subscriber = listener.get_connection().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe(format!("{GRANT_CHANNELS}g")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let name = "granted";
    held_with_three_waiters(&mut con, name);
    let before = server_ms(&mut con);
    assert_eq!(release_guessing_g1(&mut con, name), (0, String::new(), 0));
    assert_eq!(field(&mut con, name, "flag").as_deref(), Some("g:1"));
    assert_eq!(field(&mut con, name, "waited").as_deref(), Some("1"));
    let token: i64 = field(&mut con, name, "fence").unwrap().parse().unwrap();
    assert!(token > 10, "{token}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key(name))
        .query(&mut con)
        .unwrap();
    assert!(pttl > 0 && pttl <= 2000, "{pttl}");
    // One token set aside for g:2, the line.
    let counter: i64 = redis::cmd("GET")
        .arg(format!("redbaton:{{{name}}}:fair:fence"))
        .query(&mut con)
        .unwrap();
    assert_eq!(counter, token + 1);
    let queue: Vec<String> = redis::cmd("ZRANGE")
        .arg(queue_key(name))
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert_eq!(queue, ["g:1", "g:2", "r:9"], "the places stay");
    let end = place_end(&mut con, name, "g:1");
    assert!(
        end >= before && end <= server_ms(&mut con) + 2000.0,
        "{end}"
    );
    assert_eq!(list_len(&mut con, &own_list(name, "g:1")), 0, "no token");
    let message: Vec<u8> = pubsub.get_message().unwrap().get_payload().unwrap();
    let (key, list) = (lock_key(name), own_list(name, "g:1"));
    assert_eq!(
        String::from_utf8(message).unwrap(),
        format!("g:1 7 {token} g:2,200;r:9 {} {key}{list}", key.len())
    );
}

/// Nobody hears the grant (its client is gone): the release wakes the
/// guessed head as before, and changes nothing else.
#[test]
fn a_grant_nobody_hears_wakes_the_head_instead() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let name = "unheard";
    held_with_three_waiters(&mut con, name);
    assert_eq!(release_guessing_g1(&mut con, name), (0, String::new(), 0));
    let exists: bool = redis::cmd("EXISTS")
        .arg(lock_key(name))
        .query(&mut con)
        .unwrap();
    assert!(!exists, "free");
    assert_eq!(list_len(&mut con, &own_list(name, "g:1")), 1, "woken");
    assert_eq!(place_end(&mut con, name, "g:1"), (u64::MAX >> 12) as f64);
}

/// The gates of the guessed holder and of the first granted waiter.
type Gates = [mpsc::Sender<()>; 2];

/// Who was served, with its guard's token.
type Served = mpsc::Receiver<(&'static str, u64)>;

/// `first` holds `name`; `guessed`'s waiter and then `threads` waiters of
/// the client `granted` queue behind it, each parked (60 s parks).
/// `first`'s release serves `guessed`, whose fresh acquisition finds
/// `granted`'s first waiter next. Returns the gates of the guessed holder
/// and of the first granted waiter (each unlocks when told), the waiters'
/// threads, and the receiver of (who, token) as each is served.
fn guessed_then_granted(
    server: &RedisServer,
    name: &'static str,
    threads: usize,
) -> (Gates, Vec<thread::JoinHandle<()>>, Served) {
    let first = Client::open(&server.url()).unwrap();
    let held = first.fair_lock(name).unwrap().lock().unwrap();
    let (guessed, granted) = (patient(server), patient(server));
    let (go, gates): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::channel::<()>()).unzip();
    let mut gates = gates.into_iter().map(Some);
    let waiters = [("guessed", &guessed), ("granted", &granted)]
        .into_iter()
        .chain(["granted 2", "granted 3"].map(|who| (who, &granted)))
        .take(threads + 1)
        .map(|(who, client)| InTurnWaiter {
            who,
            client,
            gate: gates.next().flatten(),
            then: unlocked,
            reenters: false,
        })
        .collect();
    let (threads, order) = queued_in_turn(server, name, waiters, None);
    held.unlock().unwrap();
    let guessed = order.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(guessed.0, "guessed");
    // Granted too (it asked while `first` held the lock): its renewal
    // comes before what the tests count.
    renewed_past_grant(server, name);
    (go.try_into().unwrap(), threads, order)
}

/// The fencing token of the ownership of `name` in Redis.
fn token_in_redis(server: &RedisServer, name: &str) -> u64 {
    redis::cmd("HGET")
        .arg(lock_key(name))
        .arg("fence")
        .query(&mut server.connection())
        .unwrap()
}

/// A waiter of another client, the head the holder's acquisition found
/// next, is granted the fair lock by the holder's release: it wakes
/// holding it, with no attempt of its own (the release and its own
/// release are the only scripts, one `PUBLISH`, no token pushed or
/// popped), under a token above the holder's, the one in Redis.
#[test]
fn the_guessed_head_of_another_client_is_granted_the_lock_without_an_attempt() {
    let server = RedisServer::start();
    let name = "without_attempt";
    let ([guessed, granted], threads, order) = guessed_then_granted(&server, name, 1);
    let before = server.command_calls();
    guessed.send(()).unwrap();
    let (who, token) = order.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(who, "granted");
    assert_eq!(
        token,
        token_in_redis(&server, name),
        "the ownership's token"
    );
    let lock = Client::open(&server.url())
        .unwrap()
        .fair_lock(name)
        .unwrap();
    assert_eq!(lock.queued_waiters().unwrap(), 0, "the holder's place");
    granted.send(()).unwrap();
    for thread in threads {
        thread.joined();
    }
    let used = server.commands_since(&before);
    granted_without_an_attempt(&server, name, &used);
}

/// The fair lock `name` on `server`, held by a client of its own.
fn held(server: &RedisServer, name: &str) -> redbaton::LockGuard {
    Client::open(&server.url())
        .unwrap()
        .fair_lock(name)
        .unwrap()
        .lock()
        .unwrap()
}

/// Waits for `lock` (20 s at most), unlocks it at once; the token it was
/// served under.
fn served_then_unlocked(lock: &redbaton::Lock) -> u64 {
    let guard = lock
        .try_lock_for(Duration::from_secs(20))
        .unwrap()
        .expect("served");
    let token = guard.fencing_token();
    guard.unlock().unwrap();
    token
}

/// What a hand-off by grant alone ran (`used`): the release and the
/// grantee's own release, one `PUBLISH`, no token pushed or popped; and
/// the grantee's release dropped its place in `name`'s queue.
fn granted_without_an_attempt(
    server: &RedisServer,
    name: &str,
    used: &std::collections::BTreeMap<String, u64>,
) {
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    assert_eq!(used.get("rpush"), None, "{used:?}");
    assert_eq!(used.get("lpop"), None, "{used:?}");
    assert_eq!(support::scripts_run(used), 2, "{used:?}");
    assert_eq!(queue_len(server, name), 0, "its release dropped its place");
}

/// A waiter of another client that asked while the lock was held (the
/// head of the queue, parked on the head's list, its spec beside `next`)
/// is granted the lock by the holder's release: it wakes holding it, with
/// no attempt of its own (the release and its own release are the only
/// scripts, one `PUBLISH`, no token pushed or popped), under a token above
/// the holder's.
#[test]
fn the_head_that_asked_while_the_lock_was_held_is_granted_it_without_an_attempt() {
    let server = RedisServer::start();
    let name = "asked_while_held";
    let held = held(&server, name);
    let held_token = held.fencing_token();
    // A fixed lease no longer than a grant's: granted, and never renewed
    // (no renewal among the scripts counted).
    let lock = patient(&server)
        .fair_lock(name)
        .unwrap()
        .with_fixed_lease(Duration::from_secs(2))
        .unwrap();
    let (tokens, token) = mpsc::channel();
    let wait = move || tokens.send(served_then_unlocked(&lock)).unwrap();
    let used = support::hand_off_commands(&server, wait, || held.unlock().unwrap());
    let token = token.recv().unwrap();
    assert!(token > held_token, "{token} after {held_token}");
    granted_without_an_attempt(&server, name, &used);
}

/// A head that may not be granted the lock (a fixed lease longer than a
/// grant's) leaves no spec beside `next`, not even the one of the head
/// before it (which gave up): the release wakes it, with no grant under
/// another waiter's spec.
#[test]
fn a_head_that_may_not_be_granted_leaves_no_spec_of_the_head_before_it() {
    let server = RedisServer::start();
    let name = "ungrantable_head";
    let held = held(&server, name);
    let gave_up = patient(&server)
        .fair_lock(name)
        .unwrap()
        .try_lock_for(Duration::from_millis(300))
        .unwrap();
    assert!(gave_up.is_none(), "held all along");
    let mut con = server.connection();
    let first_head = field(&mut con, name, "next");
    assert!(
        field(&mut con, name, "nspec").is_some(),
        "the first head's spec"
    );
    let lock = patient(&server)
        .fair_lock(name)
        .unwrap()
        .with_fixed_lease(Duration::from_secs(30))
        .unwrap();
    let waiter = thread::spawn(move || served_then_unlocked(&lock));
    support::eventually(Duration::from_secs(10), "the next head", || {
        field(&mut con, name, "next").is_some_and(|next| Some(&next) != first_head.as_ref())
    });
    let before = server.command_calls();
    held.unlock().unwrap();
    waiter.joined();
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), None, "no grant: {used:?}");
    assert_eq!(used.get("rpush"), Some(&1), "woken: {used:?}");
    assert_eq!(queue_len(&server, name), 0);
}

/// A grant that finds no waiter parked with its ticket (the spec names an
/// older request) is given back by the waiter's client; its place stayed,
/// so the give-back wakes it, and it is served within seconds, not at its
/// park's end (60 s).
#[test]
fn a_grant_given_back_leaves_the_head_its_turn() {
    let server = RedisServer::start();
    let name = "given_back";
    let ([guessed, granted], threads, order) = guessed_then_granted(&server, name, 1);
    let granted_waiter: Vec<String> = redis::cmd("ZRANGE")
        .arg(queue_key(name))
        .arg(0)
        .arg(0)
        .query(&mut server.connection())
        .unwrap();
    let [waiter] = &granted_waiter[..] else {
        panic!("one place: {granted_waiter:?}");
    };
    redis::cmd("SET")
        .arg(spec_key(name, waiter))
        .arg("999999 2000 0")
        .query::<()>(&mut server.connection())
        .unwrap();
    let before = server.command_calls();
    let released = Instant::now();
    guessed.send(()).unwrap();
    let (who, _) = order.recv_timeout(Duration::from_secs(20)).unwrap();
    let took = released.elapsed();
    granted.send(()).unwrap();
    for thread in threads {
        thread.joined();
    }
    assert_eq!(who, "granted");
    assert!(took < Duration::from_secs(5), "served {took:?} after");
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "granted once: {used:?}");
    assert_eq!(queue_len(&server, name), 0);
}

/// A grant to the head parked on the head's list that its client gives
/// back (the spec beside `next` names an older request) leaves it its
/// turn: the give-back's release finds it the head again and wakes it,
/// within seconds, not at its park's end (30 s).
#[test]
fn a_grant_to_the_head_on_the_heads_list_given_back_leaves_it_its_turn() {
    let server = RedisServer::start();
    let name = "given_back_on_the_heads_list";
    let held = held(&server, name);
    let lock = patient(&server).fair_lock(name).unwrap();
    let waiter = thread::spawn(move || served_then_unlocked(&lock));
    let mut con = server.connection();
    support::eventually(Duration::from_secs(10), "the head parked", || {
        field(&mut con, name, "nspec").is_some() && support::parked(&server) == 1
    });
    redis::cmd("HSET")
        .arg(lock_key(name))
        .arg("nspec")
        .arg("999999 2000 0")
        .query::<()>(&mut con)
        .unwrap();
    let before = server.command_calls();
    let released = Instant::now();
    held.unlock().unwrap();
    waiter.joined();
    let took = released.elapsed();
    assert!(took < Duration::from_secs(5), "served {took:?} after");
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "granted once: {used:?}");
    assert_eq!(queue_len(&server, name), 0);
}

/// A grant passes along the line of the grantee's client's threads queued
/// behind it: the grantee's release passes the lock to the next in memory
/// (the next token, no script), as after a fresh acquisition.
#[test]
fn a_grant_passes_along_the_line_of_the_grantees_client() {
    let server = RedisServer::start();
    let name = "line";
    let ([guessed, granted], threads, order) = guessed_then_granted(&server, name, 2);
    let before = server.command_calls();
    guessed.send(()).unwrap();
    let first = order.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(first.0, "granted");
    granted.send(()).unwrap();
    let next = order.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(next, ("granted 2", first.1 + 1), "passed in memory");
    for thread in threads {
        thread.joined();
    }
    let used = server.commands_since(&before);
    assert_eq!(used.get("publish"), Some(&1), "{used:?}");
    // The guessed holder's release and the run's last release.
    assert_eq!(support::scripts_run(&used), 2, "{used:?}");
    assert_eq!(queue_len(&server, name), 0, "the run dropped its places");
}

/// A child process's waiter of the fair lock "stopped", with the default
/// settings: it says WAITING, then waits up to 60 s.
pub(crate) fn granted_waiter(url: &str) {
    let client = Client::open(url).unwrap();
    let lock = client.fair_lock("stopped").unwrap();
    println!("WAITING");
    let got = lock.try_lock_for(Duration::from_secs(60)).unwrap();
    println!("GOT {}", got.is_some());
}

/// A granted waiter whose process stops before it reads the grant (its
/// connections stay open, so the server counts it as hearing) costs the
/// waiter behind it the grant's lease (2 s) and a park (2 s), not its
/// place's life or its lease (30 s).
#[test]
fn a_grant_to_a_stopped_process_costs_the_others_its_short_lease() {
    const NAME: &str = "stopped";
    let server = RedisServer::start();
    let holder = Client::open(&server.url()).unwrap();
    let held = holder.fair_lock(NAME).unwrap().lock().unwrap();
    let (go, may_go) = mpsc::channel::<()>();
    // The guessed: its acquisition finds the child's waiter next.
    let guessed = Client::open(&server.url())
        .unwrap()
        .fair_lock(NAME)
        .unwrap();
    let (told, served) = mpsc::channel();
    let guessed = thread::spawn(move || {
        let guard = guessed.try_lock_for(Duration::from_secs(30)).unwrap();
        told.send(guard.is_some()).unwrap();
        may_go.recv().unwrap();
        drop(guard);
    });
    support::eventually(Duration::from_secs(10), "the first queued", || {
        queue_len(&server, NAME) == 1
    });
    let mut child = support::spawn_child("fair_granted", &server);
    child.wait_for_line("WAITING", Duration::from_secs(30));
    let mut raw = server.connection();
    let mut child_waiter = String::new();
    support::eventually(Duration::from_secs(10), "the child queued", || {
        let queue: Vec<String> = redis::cmd("ZRANGE")
            .arg(queue_key(NAME))
            .arg(0)
            .arg(-1)
            .query(&mut raw)
            .unwrap();
        if let [_, second] = &queue[..] {
            child_waiter = second.clone();
        }
        !child_waiter.is_empty()
    });
    let behind = Client::open(&server.url())
        .unwrap()
        .fair_lock(NAME)
        .unwrap();
    let behind = thread::spawn(move || {
        let guard = behind.try_lock_for(Duration::from_secs(20)).unwrap();
        (guard.is_some(), Instant::now())
    });
    support::eventually(Duration::from_secs(10), "the last queued", || {
        queue_len(&server, NAME) == 3
    });
    held.unlock().unwrap();
    assert_eq!(served.recv_timeout(Duration::from_secs(20)), Ok(true));
    child.signal_stop();
    let released = Instant::now();
    go.send(()).unwrap();
    guessed.joined();
    assert_eq!(
        field(&mut raw, NAME, "flag").as_deref(),
        Some(child_waiter.as_str()),
        "granted to the child"
    );
    let (got, at) = behind.joined();
    child.signal_continue();
    child.kill();
    assert!(got, "the waiter behind served");
    let waited = at.duration_since(released);
    assert!(
        waited < Duration::from_secs(8),
        "served after {waited:?} (a grant's lease is 2 s, the child's own 30 s)"
    );
}

//! How a multi-lock waits: parked on the baton of the name in its way,
//! holding nothing, woken by that name's release (never by polling), a
//! partial set that is lost given back, and what waiting costs in commands.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::RedisServer;

use crate::exists;
use crate::support::{client, eventually, is_asleep, parked, thread_id, JoinWithin};

/// A client whose waiters would look again only every 30 s on their own:
/// a waiter that wins sooner was woken by a release.
fn patient(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

#[test]
fn a_waiter_parks_holding_nothing_and_a_release_wakes_it() {
    let server = RedisServer::start();
    let (holder, waiter, bystander) = (client(&server), patient(&server), client(&server));
    let held = holder.lock("park-b").unwrap().lock().unwrap();
    let set = waiter
        .multi_lock(["park-a", "park-b"])
        .unwrap()
        // Holding nothing while it waits (no partial set).
        .hold_back_after(Duration::MAX);
    let (tx, rx) = mpsc::channel();
    let waiting = thread::spawn(move || {
        let guard = set.try_lock_for(Duration::from_secs(20)).unwrap();
        tx.send(Instant::now()).unwrap();
        guard.is_some()
    });
    eventually(Duration::from_secs(5), "the waiter parks", || {
        parked(&server) == 1
    });
    // Parked, it holds nothing: `a` is free for anyone.
    assert!(!exists(&server, "park-a"));
    let a = bystander.lock("park-a").unwrap().try_lock().unwrap();
    assert!(a.is_some(), "a waiter kept a name of its set");
    drop(a);
    let released = Instant::now();
    held.unlock().unwrap();
    assert!(waiting.joined());
    let woken = rx.recv().unwrap().duration_since(released);
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
}

/// A waiter woken on one name that finds another name of its set held
/// moves to that name's baton, still holding nothing.
#[test]
fn a_waiter_moves_to_the_name_in_its_way() {
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server), patient(&server));
    let held_a = holder.lock("move-a").unwrap().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let holder_thread = thread::spawn(move || {
        // A second thread of the holder's client holds `b`, so that the
        // two releases come from their own threads.
        let b = holder.lock("move-b").unwrap().lock().unwrap();
        tx.send(()).unwrap();
        thread::park();
        b.unlock().unwrap();
    });
    rx.recv().unwrap();
    let set = waiter
        .multi_lock(["move-a", "move-b"])
        .unwrap()
        // Holding nothing while it waits (no partial set).
        .hold_back_after(Duration::MAX);
    let (won, when) = mpsc::channel();
    let waiting = thread::spawn(move || {
        let guard = set.try_lock_for(Duration::from_secs(20)).unwrap();
        won.send(Instant::now()).unwrap();
        guard.map(|guard| guard.fencing_tokens().count())
    });
    eventually(Duration::from_secs(5), "the waiter parks on a", || {
        parked(&server) == 1
    });
    held_a.unlock().unwrap();
    // Woken by `a`, it finds `b` held and parks again, leaving `a` free.
    eventually(Duration::from_secs(5), "the waiter parks on b", || {
        parked(&server) == 1 && !exists(&server, "move-a")
    });
    assert!(!waiting.is_finished());
    let released = Instant::now();
    holder_thread.thread().unpark();
    holder_thread.joined();
    assert_eq!(waiting.joined(), Some(2));
    // Woken by `b`'s release, not by the end of a 30 s park.
    let woken = when.recv().unwrap().duration_since(released);
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
}

/// A set waiter woken by one name's release that finds another name of
/// its set held leaves the first name free, and passes the wake-up it took
/// on: that name's plain waiter, parked behind it in Redis, gets it at
/// once, not at its next look (30 s here).
#[test]
fn a_waiter_that_moves_on_passes_the_wake_up_it_took_on() {
    let server = RedisServer::start();
    let (holder, waiter, other) = (client(&server), patient(&server), patient(&server));
    let held_a = holder.lock("pass-a").unwrap().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let holder_thread = thread::spawn(move || {
        let b = holder.lock("pass-b").unwrap().lock().unwrap();
        tx.send(()).unwrap();
        thread::park();
        b.unlock().unwrap();
    });
    rx.recv().unwrap();
    let set = waiter
        .multi_lock(["pass-a", "pass-b"])
        .unwrap()
        // Holding nothing while it waits (no partial set).
        .hold_back_after(Duration::MAX);
    let waiting =
        thread::spawn(move || set.try_lock_for(Duration::from_secs(20)).unwrap().is_some());
    eventually(Duration::from_secs(5), "the set parks on a", || {
        parked(&server) == 1
    });
    // Parked after the set, so the release's baton goes to the set.
    let plain = other.lock("pass-a").unwrap();
    let (got, when) = mpsc::channel();
    let plain_waiter = thread::spawn(move || {
        let guard = plain.try_lock_for(Duration::from_secs(20)).unwrap();
        got.send(Instant::now()).unwrap();
        guard.is_some()
    });
    eventually(
        Duration::from_secs(5),
        "the plain waiter parks on a",
        || parked(&server) == 2,
    );
    let released = Instant::now();
    held_a.unlock().unwrap();
    assert!(plain_waiter.joined(), "the plain waiter got a");
    let woken = when.recv().unwrap().duration_since(released);
    assert!(
        woken < Duration::from_secs(2),
        "the plain waiter got a after {woken:?}"
    );
    holder_thread.thread().unpark();
    holder_thread.joined();
    assert!(waiting.joined(), "the set got both");
}

/// A thread that releases a name and asks for it again at once queues
/// behind a set waiter of its own client parked on that name. The set,
/// woken, finds its other name held and moves on, passing the baton on;
/// the releasing thread, now first in its client's queue, must not take
/// the name ahead of another client's waiter that was parked for it all
/// along (it asked after the release's hand-over window opened), nor,
/// refused, take the baton passed on to that waiter (it sleeps out the
/// window instead of parking). Without the first rule it takes the name
/// whenever its own client's look pops the baton first, about one round
/// in two; without the second, about one round in twenty.
#[test]
fn a_releaser_queued_behind_its_own_set_waiter_does_not_take_the_name_from_another_clients_waiter()
{
    const ROUNDS: usize = 10;
    let server = RedisServer::start();
    let (home, away, blocker) = (patient(&server), patient(&server), client(&server));
    for round in 0..ROUNDS {
        let (a, b) = (format!("turn-a-{round}"), format!("turn-b-{round}"));
        let base = parked(&server);
        let again = home.lock(&b).unwrap();
        let held_b = again.lock().unwrap();
        // `a` free, `b` held: the set parks on `b`.
        let set = home
            .multi_lock([a.as_str(), b.as_str()])
            .unwrap()
            .hold_back_after(Duration::MAX);
        let set_waiter =
            thread::spawn(move || set.try_lock_for(Duration::from_secs(20)).unwrap().is_some());
        eventually(Duration::from_secs(5), "the set parks on b", || {
            parked(&server) == base + 1
        });
        let (tx, order) = mpsc::channel();
        let away_lock = away.lock(&b).unwrap();
        let away_tx = tx.clone();
        let away_waiter = thread::spawn(move || {
            let guard = away_lock.try_lock_for(Duration::from_secs(20)).unwrap();
            away_tx.send(("away", Instant::now())).unwrap();
            thread::sleep(Duration::from_millis(20));
            guard.is_some()
        });
        eventually(
            Duration::from_secs(5),
            "the other client parks on b",
            || parked(&server) == base + 2,
        );
        let held_a = blocker.lock(&a).unwrap().lock().unwrap();
        let released = Instant::now();
        held_b.unlock().unwrap();
        let taken_again = again.try_lock_for(Duration::from_secs(20)).unwrap();
        tx.send(("home", Instant::now())).unwrap();
        assert!(taken_again.is_some());
        drop(taken_again);
        assert!(away_waiter.joined(), "the other client's waiter got b");
        let (first, at) = order.recv().unwrap();
        drop(held_a);
        assert!(set_waiter.joined(), "the set got both");
        assert_eq!(
            first,
            "away",
            "round {round}: the releasing thread took b again, {:?} after its release, ahead \
             of the waiter parked for it",
            at - released
        );
    }
}

/// A waiter whose deadline passes returns `None` holding nothing.
#[test]
fn a_deadline_ends_the_wait_with_nothing_held() {
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server), client(&server));
    let held = holder.lock("late-b").unwrap().lock().unwrap();
    let set = waiter.multi_lock(["late-a", "late-b"]).unwrap();
    let start = Instant::now();
    assert!(set
        .try_lock_for(Duration::from_millis(400))
        .unwrap()
        .is_none());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(!exists(&server, "late-a"));
    held.unlock().unwrap();
}

/// Threads of one client: a plain lock of `a` released while a multi-lock
/// of `{a, b}` waits in the process's queue for `a` behind a parked plain
/// waiter is handed to the multi-lock locally; holding `a` alone is not
/// the set, so it takes `{a, b}` then, or gives `a` back when `b` is held.
#[test]
fn a_local_hand_off_of_one_name_becomes_the_whole_set_or_nothing() {
    let server = RedisServer::start();
    let (shared, other) = (patient(&server), client(&server));
    let a = shared.lock("hand-a").unwrap();
    let held_b = other.lock("hand-b").unwrap().lock().unwrap();
    let held_a = a.lock().unwrap();
    // A plain waiter parks for the process...
    let plain = {
        let a = a.clone();
        thread::spawn(move || a.try_lock_for(Duration::from_secs(20)).unwrap().is_some())
    };
    eventually(Duration::from_secs(5), "the plain waiter parks", || {
        parked(&server) == 1
    });
    // ...and the multi-lock queues behind it, asleep.
    let set = shared
        .multi_lock(["hand-a", "hand-b"])
        .unwrap()
        // Holding nothing while it waits (no partial set).
        .hold_back_after(Duration::MAX);
    let (tx, rx) = mpsc::channel();
    let multi = thread::spawn(move || {
        tx.send(thread_id()).unwrap();
        let guard = set.try_lock_for(Duration::from_secs(20)).unwrap();
        guard.map(|guard| guard.fencing_tokens().count())
    });
    let tid = rx.recv().unwrap();
    eventually(Duration::from_secs(5), "the multi-lock waits", || {
        is_asleep(tid)
    });
    // `a` is handed to the multi-lock, which finds `b` held: it gives `a`
    // back (to the plain waiter) and waits for `b`.
    held_a.unlock().unwrap();
    assert!(plain.joined(), "the plain waiter got `a` after all");
    assert!(!multi.is_finished());
    held_b.unlock().unwrap();
    assert_eq!(multi.joined(), Some(2));
}

/// A set that takes its names one at a time (it waited `hold_back_after`)
/// keeps a partial set only for its window (1.5 `max_park` + 500 ms, 0.8 s
/// here): a thread that holds `b` and then asks for `a` (nesting plain
/// locks in the other order) gets `a` once the window ends, instead of
/// waiting for the set for ever; then the set gets both.
#[test]
fn a_partial_set_is_given_back_at_the_end_of_its_window() {
    let server = RedisServer::start();
    let nester = client(&server);
    let waiter = Client::builder(server.url())
        .max_park(Duration::from_millis(200))
        .build()
        .unwrap();
    let b = nester.lock("nest-b").unwrap().lock().unwrap();
    let set = waiter
        .multi_lock(["nest-a", "nest-b"])
        .unwrap()
        .hold_back_after(Duration::from_millis(50));
    let waiting = thread::spawn(move || {
        let guard = set.try_lock_for(Duration::from_secs(10)).unwrap();
        guard.map(|guard| guard.fencing_tokens().count())
    });
    // The set took `a` and waits for `b`.
    eventually(Duration::from_secs(5), "the set holds a", || {
        exists(&server, "nest-a")
    });
    let asked = Instant::now();
    let a = nester
        .lock("nest-a")
        .unwrap()
        .try_lock_for(Duration::from_secs(5))
        .unwrap();
    let got_a = asked.elapsed();
    assert!(a.is_some(), "the nesting thread never got a");
    assert!(
        got_a < Duration::from_millis(1_800),
        "the nesting thread got a after {got_a:?} (window 0.8 s)"
    );
    drop(a);
    drop(b);
    assert_eq!(waiting.joined(), Some(2), "the set got both names");
}

/// A set whose deadline passes while it holds part of the set returns
/// `None` and holds nothing.
#[test]
fn a_deadline_during_a_partial_set_leaves_nothing_held() {
    let server = RedisServer::start();
    let holder = client(&server);
    let waiter = client(&server);
    let b = holder.lock("part-b").unwrap().lock().unwrap();
    let set = waiter
        .multi_lock(["part-a", "part-b"])
        .unwrap()
        .hold_back_after(Duration::from_millis(20));
    let waiting = thread::spawn(move || {
        let guard = set.try_lock_for(Duration::from_millis(600)).unwrap();
        guard.is_some()
    });
    eventually(Duration::from_secs(5), "the set holds a", || {
        exists(&server, "part-a")
    });
    assert!(!waiting.joined(), "the set got b while it was held");
    assert!(
        !exists(&server, "part-a"),
        "a left held by a set that returned None"
    );
    drop(b);
}

/// A name a set took while it waits for the next one can be lost
/// meanwhile (its renewals failed until its lease ended, as across a
/// Sentinel failover: the fault matrix's `multi_sentinel_master_killed`
/// found a set returned with such a name while a plain locker held it).
/// Here its key is deleted and another client takes it, and the watchdog
/// finds it gone: when the next name comes free, the set must not come
/// back with the lost one; it gives back what it took, waits for that
/// name, and gets a fresh hold.
#[test]
fn a_name_lost_while_the_set_waits_for_the_next_one_is_taken_afresh() {
    // Renewed every third of a second: the deleted key is found soon.
    name_lost_while_the_set_waits("relost", Duration::from_secs(1), true);
}

/// As above, but the set's client has not found the name gone yet (its
/// watchdog renews every 10 s), as after a Sentinel failover to a replica
/// that never had it (`multi_sentinel_failover` saw a set come back with
/// such a name): the set checks the names it took before the last in
/// Redis before it comes back.
#[test]
fn a_name_gone_from_redis_while_the_set_waits_for_the_next_one_is_taken_afresh() {
    name_lost_while_the_set_waits("regone", Duration::from_secs(30), false);
}

/// A set `{<tag>-a, <tag>-b}` of a client with `lease` takes `a` and
/// waits for `b`; `a`'s key is deleted and another client takes `a`
/// (first waiting until the set's watchdog finds `a` lost, when `told`);
/// `b` is released. The set must wait for `a` again, and come back with a
/// fresh hold of `a` once the other releases it.
fn name_lost_while_the_set_waits(tag: &str, lease: Duration, told: bool) {
    let server = RedisServer::start();
    let (holder, other) = (client(&server), client(&server));
    let (a_name, b_name) = (format!("{tag}-a"), format!("{tag}-b"));
    let (lost_a, parked_a) = (format!("lost {a_name}"), format!("parked {a_name}"));
    let (told_tx, events) = mpsc::channel();
    let waiter = Client::builder(server.url())
        .io_timeout(Duration::from_secs(2))
        .default_lease(lease)
        // A partial set's window of 8 s: it does not end on its own here.
        .max_park(Duration::from_secs(5))
        .on_event(move |event| {
            let seen = match event {
                redbaton::Event::Lost { name, .. } => format!("lost {name}"),
                redbaton::Event::Parked { name, .. } => format!("parked {name}"),
                _ => return,
            };
            let _ = told_tx.send(seen);
        })
        .build()
        .unwrap();
    let b = holder.lock(&b_name).unwrap().lock().unwrap();
    let set = waiter
        .multi_lock([&a_name, &b_name])
        .unwrap()
        .hold_back_after(Duration::from_millis(20));
    let token_of_a = a_name.clone();
    let waiting = thread::spawn(move || {
        let guard = set.try_lock_for(Duration::from_secs(30)).unwrap();
        guard.map(|guard| (guard.is_lost(), guard.fencing_token(&token_of_a)))
    });
    // The set took `a` and waits for `b`.
    eventually(Duration::from_secs(5), "the set holds a", || {
        exists(&server, &a_name)
    });
    // Its hold of `a` ends behind its back, and another takes `a`.
    redis::cmd("DEL")
        .arg(crate::support::lock_key(&a_name))
        .query::<()>(&mut server.connection())
        .unwrap();
    let a = other.lock(&a_name).unwrap().try_lock().unwrap();
    let a = a.expect("a is free once its key is gone");
    if told {
        let deadline = Instant::now() + Duration::from_secs(10);
        while events.recv_timeout(Duration::from_millis(20)).ok().as_ref() != Some(&lost_a) {
            assert!(Instant::now() < deadline, "the watchdog never found a gone");
        }
    }
    b.unlock().unwrap();
    // The set gets `b` and must then wait for `a` again, not come back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while events.recv_timeout(Duration::from_millis(20)).ok().as_ref() != Some(&parked_a) {
        assert!(
            !waiting.is_finished(),
            "the set came back with a name lost and held by another: (lost, token of a) = {:?}",
            waiting.joined()
        );
        assert!(Instant::now() < deadline, "the set never waited for a");
    }
    let taken_over = a.fencing_token();
    a.unlock().unwrap();
    let (lost, token) = waiting.joined().expect("the set got both names");
    assert!(!lost, "the set came back with a lost name");
    assert!(
        token > Some(taken_over),
        "a's token {token:?} is not newer than the other holder's {taken_over}"
    );
}

/// Waiting threads in the waiting-cost tests, how long they wait, and the
/// longest park (as in the lock's
/// `twenty_waiters_during_a_three_second_hold_send_a_bounded_number_of_commands`).
const WAITERS: usize = 20;
const HOLD: Duration = Duration::from_secs(3);
const MAX_PARK: Duration = Duration::from_secs(1);
/// How long each waits at most: far past the hold.
const WAIT: Duration = Duration::from_secs(30);

/// The commands a waiting client sends itself: `INFO commandstats` also
/// counts those scripts call inside the server (hmget, pttl, ...), which
/// cost no round trip.
const SENT: &[&str] = &["evalsha", "eval", "script|load", "blpop", "incr", "exists"];

/// What the waiters sent during a hold.
struct Cost {
    /// The commands of [`SENT`], summed.
    total: u64,
    blpops: u64,
    /// Connections blocked at the end of the hold.
    parked: u64,
    /// Every command the server counted, for the messages.
    during: std::collections::BTreeMap<String, u64>,
}

/// Holds `held` with a plain lock of a client of its own for [`HOLD`]
/// while [`WAITERS`] threads, spread evenly over `clients` (each with
/// [`MAX_PARK`]), wait for `names`: the multi-lock of them, or the plain
/// lock of a single name. Then releases it, and checks that every waiter
/// gets what it waited for; returns what they sent during the hold.
fn waiting_cost(server: &RedisServer, clients: &[Client], held: &str, names: &[&str]) -> Cost {
    let holder = client(server);
    let guard = holder.lock(held).unwrap().lock().unwrap();
    let before = server.command_calls();
    let (done, finished) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|index| {
            let client = &clients[index % clients.len()];
            // The guard each gets is dropped (released) at once.
            let wait: Box<dyn FnOnce() -> bool + Send> = match names {
                [name] => {
                    let lock = client.lock(name).unwrap();
                    Box::new(move || lock.try_lock_for(WAIT).unwrap().is_some())
                }
                _ => {
                    let set = client.multi_lock(names).unwrap();
                    Box::new(move || set.try_lock_for(WAIT).unwrap().is_some())
                }
            };
            let done = done.clone();
            thread::spawn(move || {
                let got = wait();
                done.send(got).unwrap();
            })
        })
        .collect();
    // Creates the situation: waiters behind a 3 s hold.
    thread::sleep(HOLD);
    let during = server.commands_since(&before);
    let parked = parked(server);
    guard.unlock().unwrap();
    for _ in 0..WAITERS {
        let got = finished.recv_timeout(WAIT);
        assert_eq!(
            got,
            Ok(true),
            "a waiter did not get {names:?} after the release"
        );
    }
    for waiter in waiters {
        waiter.joined();
    }
    Cost {
        total: SENT.iter().filter_map(|c| during.get(*c)).sum(),
        blpops: during.get("blpop").copied().unwrap_or(0),
        parked,
        during,
    }
}

/// `n` clients with [`MAX_PARK`], as `n` processes would be.
fn waiting_clients(server: &RedisServer, n: usize) -> Vec<Client> {
    (0..n)
        .map(|_| {
            Client::builder(server.url())
                .max_park(MAX_PARK)
                .io_timeout(Duration::from_secs(2))
                .build()
                .unwrap()
        })
        .collect()
}

/// The lock test's bound on what its twenty waiters send during a 3 s
/// hold: first attempts (a script call, an `INCR` for a new thread's
/// identity) and two commands per waiter per `max_park`.
fn lock_bound() -> u64 {
    let parks = (HOLD.as_millis() / MAX_PARK.as_millis()) as u64;
    2 * WAITERS as u64 + 2 * WAITERS as u64 * parks
}

/// Checks `cost` of `clients` waiting clients for `names` names against
/// the plain lock's bounds: [`lock_bound`] in all; per client and name,
/// one parked connection, and a `BLPOP` per `max_park` and two more.
fn assert_bounded(cost: &Cost, clients: u64, names: u64) {
    let bound = lock_bound();
    assert!(
        cost.total <= bound,
        "{} commands > {bound}: {:?}",
        cost.total,
        cost.during
    );
    assert!(
        cost.parked <= clients * names,
        "{} blocked connections for {clients} clients waiting on {names} names",
        cost.parked
    );
    let parks = (HOLD.as_millis() / MAX_PARK.as_millis()) as u64;
    let blpops = clients * names * (parks + 2);
    assert!(
        cost.blpops <= blpops,
        "{} BLPOPs > {blpops}: {:?}",
        cost.blpops,
        cost.during
    );
}

/// [`WAITERS`] plain waiters of `<tag>-<held>`, then as many set waiters
/// of `{<tag>-a, <tag>-b}`, spread over `clients` clients, each group
/// behind a 3 s hold of `<tag>-<held>`: prints what each group sent and
/// their ratio, and checks both against the lock test's bounds.
fn compare_with_plain_waiters(tag: &str, clients: usize, held: &str) {
    let server = RedisServer::start();
    let (a, b, held) = (
        format!("{tag}-a"),
        format!("{tag}-b"),
        format!("{tag}-{held}"),
    );
    let plain = waiting_cost(&server, &waiting_clients(&server, clients), &held, &[&held]);
    let set = waiting_cost(
        &server,
        &waiting_clients(&server, clients),
        &held,
        &[&a, &b],
    );
    println!(
        "{held} held 3 s, {WAITERS} waiters on {clients} client(s): {} commands by set waiters, {} by plain waiters ({:.1} x; the lock test's bound {}); set: {:?}; plain: {:?}",
        set.total,
        plain.total,
        set.total as f64 / plain.total.max(1) as f64,
        lock_bound(),
        set.during,
        plain.during
    );
    assert_bounded(&plain, clients as u64, 1);
    assert_bounded(&set, clients as u64, 2);
    // Like a single lock's: each set waiter makes a first attempt and one
    // as it takes its first name in turn, not one per partial set's window
    // through every waiter of the process (4-5 x before). Over two
    // clients, each client's partial set has windows of its own, which end
    // where they fall in the hold: 67-107 against 29-42 (1.8-3.6 x) behind
    // a held second name, in eight runs. One client measured 1.4-1.9 x
    // when this was written; 2026-11-30, 56-83 against 24-28 (2.1-3.3 x)
    // behind a held second name, in eight runs of two builds (a loaded CI
    // run 80 against 24): the same bound as two clients', above that.
    let ratio = 4;
    assert!(
        set.total <= ratio * plain.total.max(WAITERS as u64),
        "{} commands by set waiters, {} by plain waiters",
        set.total,
        plain.total
    );
}

/// Twenty threads wait for `{a, b}` while `a`, the first name of the set's
/// order, is held 3 s: they send no more than the lock test allows twenty
/// plain waiters (1.6-2.5 x what twenty plain waiters of `a` send, measured:
/// each set waiter makes its own first attempt, and another each time it
/// has waited `hold_back_after` and takes its names one at a time, from
/// `a`, as a plain waiter of it), and each gets the set after the release.
#[test]
fn twenty_set_waiters_behind_a_held_first_name_send_a_bounded_number_of_commands() {
    compare_with_plain_waiters("first", 1, "a");
}

/// As above, the twenty spread over two clients, as over two processes.
#[test]
fn set_waiters_of_two_clients_behind_a_held_first_name_send_a_bounded_number_of_commands() {
    compare_with_plain_waiters("first2", 2, "a");
}

/// As above with `b`, the second name, held. Once they have waited
/// `hold_back_after`, one waiter takes `a` and waits for `b` holding it;
/// the others queue for `a` holding nothing, with no window of their own,
/// and take it in turn when a partial set is given back at its window's
/// end (1.6-1.9 x what plain waiters of `b` send, measured: 44-64 against
/// 28-33; 4-5 x before, when each came back at its own window's end and
/// the given-back name went through every local waiter in turn).
#[test]
fn twenty_set_waiters_behind_a_held_second_name_send_a_bounded_number_of_commands() {
    compare_with_plain_waiters("second", 1, "b");
}

/// As above on two clients.
#[test]
fn set_waiters_of_two_clients_behind_a_held_second_name_send_a_bounded_number_of_commands() {
    compare_with_plain_waiters("second2", 2, "b");
}

//! Arrival order at every accepted `max_park`, on a default-`hz` server
//! (whose timers end a park up to 100 ms late), and across park slices.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;

use crate::support::{self, JoinWithin};
use crate::{arrivals, queue_key, queue_len};

/// How one run of [`served_order`] went.
struct Served {
    /// The waiters, numbered by arrival, in the order they were served.
    order: Vec<usize>,
    /// Places dropped while every waiter lived and waited (`ZREM`s on the
    /// server during the hold: nobody acquired or left meanwhile, so each
    /// one dropped a live waiter's place).
    dropped: u64,
}

/// `waiters` clients (one identity each) queue one after the other behind
/// a holder of the fair lock `name`, each taking its place before the next
/// asks; after `hold`, the holder releases.
fn served_order(
    server: &RedisServer,
    name: &str,
    waiters: usize,
    max_park: Duration,
    hold: Duration,
) -> Served {
    let builder = || {
        Client::builder(server.url())
            .max_park(max_park)
            .build()
            .unwrap()
    };
    let holder = builder();
    let held = holder.fair_lock(name).unwrap().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..waiters)
        .map(|i| {
            let client = builder();
            let (tx, inside) = (tx.clone(), Arc::clone(&inside));
            let owned = name.to_owned();
            let waiter = thread::spawn(move || {
                let lock = client.fair_lock(&owned).unwrap();
                let guard = lock
                    .try_lock_for(Duration::from_secs(30))
                    .unwrap()
                    .expect("served within 30 s");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tx.send(i).unwrap();
                thread::sleep(Duration::from_millis(10));
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().unwrap();
            });
            support::eventually(Duration::from_secs(10), "the waiter's place", || {
                queue_len(server, name) == i as u64 + 1
            });
            waiter
        })
        .collect();
    // Several park slices go by: each waiter comes back many times, and
    // keeps its place throughout.
    let before = server.command_calls();
    thread::sleep(hold);
    let dropped = server
        .commands_since(&before)
        .get("zrem")
        .copied()
        .unwrap_or(0);
    held.unlock().unwrap();
    let order = (0..waiters)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    for waiter in threads {
        waiter.joined();
    }
    Served { order, dropped }
}

/// Issue 21 item 5: at 20 ms and 100 ms (and 1 ms, the least `max_park`
/// accepted) a waiter's park ends on the server's tick, up to 100 ms late;
/// its place must outlive that, and a place that lapsed anyway is taken
/// again at the waiter's first arrival, so six waiters are served in the
/// order they came.
#[test]
fn waiters_are_served_in_arrival_order_at_short_max_park_on_a_default_hz_server() {
    let server = RedisServer::start();
    for max_park_ms in [1, 20, 100] {
        let name = format!("short-park-{max_park_ms}");
        let served = served_order(
            &server,
            &name,
            6,
            Duration::from_millis(max_park_ms),
            Duration::from_millis(1_200),
        );
        println!(
            "max_park {max_park_ms} ms: served {:?}, places dropped while waiting {}",
            served.order, served.dropped
        );
        assert_eq!(
            served.dropped, 0,
            "live waiters' places were dropped (max_park {max_park_ms} ms)"
        );
        assert_eq!(
            served.order,
            (0..6).collect::<Vec<_>>(),
            "max_park {max_park_ms} ms"
        );
        assert_eq!(queue_len(&server, &name), 0, "nobody left in the queue");
    }
}

/// Issue 22: a waiter keeps its arrival across park slices: behind a 2 s
/// hold, waiters with a 200 ms `max_park` come back about ten times each,
/// and the one that came first is still served first.
#[test]
fn a_waiter_keeps_its_arrival_across_park_slices() {
    let server = RedisServer::start();
    let name = "slices";
    let mut con = server.connection();
    let (tx, rx) = mpsc::channel();
    let server_url = server.url();
    let probe = thread::spawn(move || {
        // Reads the queue while the waiters come and go, on its own
        // connection.
        let mut con = redis::Client::open(server_url)
            .unwrap()
            .get_connection()
            .unwrap();
        let mut seen = Vec::new();
        while rx.try_recv().is_err() {
            seen.push(arrivals(&mut con, name));
            thread::sleep(Duration::from_millis(50));
        }
        seen
    });
    let served = served_order(
        &server,
        name,
        3,
        Duration::from_millis(200),
        Duration::from_secs(2),
    );
    tx.send(()).unwrap();
    let seen = probe.joined();
    assert_eq!(served.order, vec![0, 1, 2]);
    // Each waiter's arrival, as stored, never changed while it waited.
    let mut first: std::collections::HashMap<String, f64> = Default::default();
    for (waiter, arrival) in seen.into_iter().flatten() {
        let kept = *first.entry(waiter.clone()).or_insert(arrival);
        assert_eq!(kept, arrival, "{waiter}'s arrival changed");
    }
    assert!(arrivals(&mut con, name).is_empty());
}

/// A live waiter whose place lapsed anyway (here: removed by hand, as a
/// return later than its place's life would) takes it again at its first
/// arrival, which it sends back with each attempt: still ahead of a
/// waiter that came after it.
#[test]
fn a_waiter_whose_place_lapsed_takes_it_again_at_its_first_arrival() {
    let server = RedisServer::start();
    let name = "lapsed";
    let holder = crate::support::client(&server);
    let held = holder.fair_lock(name).unwrap().lock().unwrap();
    let mut con = server.connection();
    let (tx, rx) = mpsc::channel();
    let spawn_waiter = |i: usize| {
        let client = Client::builder(server.url())
            .max_park(Duration::from_millis(100))
            .build()
            .unwrap();
        let tx = tx.clone();
        thread::spawn(move || {
            let guard = client
                .fair_lock(name)
                .unwrap()
                .try_lock_for(Duration::from_secs(30))
                .unwrap()
                .expect("served");
            tx.send(i).unwrap();
            guard.unlock().unwrap();
        })
    };
    let first = spawn_waiter(0);
    support::eventually(Duration::from_secs(10), "the first place", || {
        queue_len(&server, name) == 1
    });
    let second = spawn_waiter(1);
    support::eventually(Duration::from_secs(10), "the second place", || {
        queue_len(&server, name) == 2
    });
    let queue = arrivals(&mut con, name);
    let (head, arrival) = queue[0].clone();
    redis::pipe()
        .cmd("ZREM")
        .arg(queue_key(name))
        .arg(&head)
        .cmd("ZREM")
        .arg(format!("redbaton:{{{name}}}:fair:lock:places"))
        .arg(&head)
        .query::<()>(&mut con)
        .unwrap();
    support::eventually(
        Duration::from_secs(10),
        "the first waiter back in the queue",
        || {
            redis::cmd("ZSCORE")
                .arg(queue_key(name))
                .arg(&head)
                .query::<Option<f64>>(&mut con)
                .unwrap()
                .is_some()
        },
    );
    let again: f64 = redis::cmd("ZSCORE")
        .arg(queue_key(name))
        .arg(&head)
        .query(&mut con)
        .unwrap();
    assert_eq!(
        again, arrival,
        "the first waiter came back at a new arrival"
    );
    held.unlock().unwrap();
    let order: Vec<usize> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    first.joined();
    second.joined();
    assert_eq!(order, vec![0, 1]);
}

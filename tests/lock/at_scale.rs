//! Waiting at scale (issue 27): one client waits on many names at once,
//! each waiter woken by its own release, on a fixed number of
//! connections; and no wake-up is lost while the set of waited names
//! changes. Bounds are generous; `cargo bench --bench waiting` measures
//! the figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{Deployment, JoinWithin, Topology};
use redbaton::Client;
use testkit::RedisServer;

/// The connections a client parks on per server, whatever the number of
/// names it waits for (the parking hub's listener and tracker).
const PARKING_CONNECTIONS: usize = 2;

/// Connections the server has now, by `CLIENT LIST`.
fn connections(server: &RedisServer) -> usize {
    let mut admin = server.connection();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
    list.lines().filter(|line| !line.trim().is_empty()).count()
}

/// A scrambled order of `0..n` (a fixed permutation: `n` is a power of
/// two and the multiplier odd).
fn scrambled(n: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 97 + 31) % n).collect()
}

/// Sorted durations' p50, p99 and max.
fn percentiles(mut values: Vec<Duration>) -> (Duration, Duration, Duration) {
    values.sort();
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), values[values.len() - 1])
}

/// 256 threads of one client each wait for a name of their own; another
/// client holds all 256 and releases them one by one, staggered, in a
/// scrambled order. Every waiter gets its lock within 200 ms of its
/// release (the old layer's one parked connection per name, 16 at most,
/// left most waiters to their maximum park: seconds), and the waiting
/// client's connections stay within its pool and a few parking ones.
#[test]
fn two_hundred_fifty_six_names_wake_at_their_release_on_a_few_connections() {
    let deployment = Deployment::start(Topology::Single);
    names_wake_at_their_release_on_a_few_connections(&deployment, &[deployment.server()]);
}

/// The same on a Cluster of three masters, the names spread over their
/// slots: each node's hub parks the names its slots serve, on two
/// connections of that node.
#[cfg(feature = "cluster")]
#[test]
fn on_a_cluster_names_over_every_master_wake_at_their_release_on_a_few_connections() {
    let deployment = Deployment::start(Topology::Cluster);
    let masters: Vec<&RedisServer> = deployment.cluster().masters().iter().collect();
    names_wake_at_their_release_on_a_few_connections(&deployment, &masters);
}

/// The body of the tests above, on `deployment`, whose masters are
/// `servers`.
fn names_wake_at_their_release_on_a_few_connections(
    deployment: &Deployment,
    servers: &[&RedisServer],
) {
    const NAMES: usize = 256;
    const POOL: u32 = 4;
    let holder = deployment.builder().pool_size(POOL).build().unwrap();
    let waiting = deployment.builder().pool_size(POOL).build().unwrap();
    let names: Vec<String> = (0..NAMES).map(|n| format!("scale:{n}")).collect();
    let guards: Vec<_> = names
        .iter()
        .map(|name| holder.lock(name).unwrap().lock().unwrap())
        .collect();
    let baseline: Vec<usize> = servers.iter().map(|server| connections(server)).collect();

    let ready = Arc::new(Barrier::new(NAMES + 1));
    let (acquired, acquisitions) = mpsc::channel();
    let waiters: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(n, name)| {
            let lock = waiting.lock(name).unwrap();
            let (ready, acquired) = (Arc::clone(&ready), acquired.clone());
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    ready.wait();
                    let guard = lock.try_lock_for(Duration::from_secs(30)).unwrap();
                    let at = Instant::now();
                    assert!(guard.is_some(), "{n}: not acquired");
                    acquired.send((n, at)).unwrap();
                })
                .unwrap()
        })
        .collect();
    ready.wait();
    // Every waiter has made its first attempt and parked: its name is
    // registered for an announcement.
    crate::support::eventually(Duration::from_secs(30), "every waiter parked", || {
        servers
            .iter()
            .map(|server| crate::support::parked(server))
            .sum::<u64>()
            == NAMES as u64
    });

    let peaks: Arc<Vec<AtomicUsize>> = Arc::new(
        servers
            .iter()
            .map(|server| AtomicUsize::new(connections(server)))
            .collect(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peaks, done) = (Arc::clone(&peaks), Arc::clone(&done));
        let ports: Vec<u16> = servers.iter().map(|server| server.port()).collect();
        thread::spawn(move || {
            let mut admins: Vec<redis::Connection> = ports
                .iter()
                .map(|port| {
                    let url = format!("redis://127.0.0.1:{port}/");
                    redis::Client::open(url).unwrap().get_connection().unwrap()
                })
                .collect();
            while !done.load(Ordering::Relaxed) {
                for (admin, peak) in admins.iter_mut().zip(peaks.iter()) {
                    let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
                    let now = list.lines().filter(|l| !l.trim().is_empty()).count();
                    peak.fetch_max(now, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let mut guards: Vec<_> = guards.into_iter().map(Some).collect();
    let mut released = vec![Instant::now(); NAMES];
    for n in scrambled(NAMES) {
        guards[n].take().unwrap().unlock().unwrap();
        released[n] = Instant::now();
        thread::sleep(Duration::from_millis(2));
    }
    let mut wakes = Vec::with_capacity(NAMES);
    for _ in 0..NAMES {
        let (n, at) = acquisitions
            .recv_timeout(Duration::from_secs(30))
            .expect("every waiter gets its lock");
        wakes.push((n, at.saturating_duration_since(released[n])));
    }
    done.store(true, Ordering::Relaxed);
    sampler.joined();
    for waiter in waiters {
        waiter.joined();
    }
    let (p50, p99, max) = percentiles(wakes.iter().map(|(_, wake)| *wake).collect());
    let peaks: Vec<usize> = peaks
        .iter()
        .map(|peak| peak.load(Ordering::Relaxed))
        .collect();
    println!(
        "{NAMES} names on {} server(s): wake after release p50 {p50:?} p99 {p99:?} max {max:?}; \
         connections per server {baseline:?} before waiting, {peaks:?} at most while waiting",
        servers.len()
    );
    let late: Vec<_> = wakes
        .iter()
        .filter(|(_, wake)| *wake > Duration::from_millis(200))
        .collect();
    assert!(late.is_empty(), "woken late: {late:?}");
    for (peak, baseline) in peaks.iter().zip(&baseline) {
        // The waiting client's command pool, its parking connections, and
        // the sampler's own connection.
        let bound = baseline + POOL as usize + PARKING_CONNECTIONS + 1;
        assert!(
            *peak <= bound,
            "{peak} connections on a server while waiting (bound {bound})"
        );
    }
}

/// Names come and go in a client's set of waited names while their locks
/// are released: a waiter of client A on each name gives up at a random
/// moment (its name leaves A's blocked call, a token popped for it goes
/// back), others of A and B wait on names never released (joining and
/// leaving all along), and a waiter of client B on each name must get the
/// lock after every release, within 200 ms of it. With a maximum park of
/// 20 s, a lost wake-up would show as a waiter woken seconds late.
#[test]
fn no_wake_up_is_lost_while_waited_names_come_and_go() {
    const NAMES: usize = 64;
    const CHURN: usize = 8;
    let server = RedisServer::start();
    let holder = Client::builder(server.url()).build().unwrap();
    let patient = |url: String| {
        Client::builder(url)
            .max_park(Duration::from_secs(20))
            .build()
            .unwrap()
    };
    let (a, b) = (patient(server.url()), patient(server.url()));
    let names: Vec<String> = (0..NAMES).map(|n| format!("churn:{n}")).collect();
    let guards: Vec<_> = names
        .iter()
        .map(|name| holder.lock(name).unwrap().lock().unwrap())
        .collect();
    let _never: Vec<_> = (0..CHURN)
        .map(|k| holder.lock(&format!("never:{k}")).unwrap().lock().unwrap())
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let mut churners = Vec::new();
    for (k, client) in (0..CHURN).flat_map(|k| [(k, a.clone()), (k, b.clone())]) {
        let stop = Arc::clone(&stop);
        churners.push(thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lock = client
                    .lock(&format!("never:{}", (k + rounds as usize) % CHURN))
                    .unwrap();
                let wait = Duration::from_millis(5 + (rounds * 7 + k as u64 * 3) % 40);
                assert!(lock.try_lock_for(wait).unwrap().is_none());
                rounds += 1;
            }
            rounds
        }));
    }

    let (acquired, acquisitions) = mpsc::channel();
    let mut waiters = Vec::new();
    for (n, name) in names.iter().enumerate() {
        // A's waiter leaves after a while, maybe just as its lock is
        // released; if it gets the lock, it passes it on at once.
        let lock = a.lock(name).unwrap();
        waiters.push(thread::spawn(move || {
            let wait = Duration::from_millis(100 + (n as u64 * 37) % 700);
            if let Some(guard) = lock.try_lock_for(wait).unwrap() {
                guard.unlock().unwrap();
            }
        }));
        let lock = b.lock(name).unwrap();
        let acquired = acquired.clone();
        waiters.push(thread::spawn(move || {
            let guard = lock.try_lock_for(Duration::from_secs(30)).unwrap();
            let at = Instant::now();
            assert!(guard.is_some(), "{n}: B's waiter did not get the lock");
            acquired.send((n, at)).unwrap();
        }));
    }
    thread::sleep(Duration::from_millis(200));

    let mut guards: Vec<_> = guards.into_iter().map(Some).collect();
    let mut released = HashMap::new();
    for n in scrambled(NAMES) {
        guards[n].take().unwrap().unlock().unwrap();
        released.insert(n, Instant::now());
        thread::sleep(Duration::from_millis(11));
    }
    let mut wakes = Vec::new();
    for _ in 0..NAMES {
        let (n, at) = acquisitions
            .recv_timeout(Duration::from_secs(30))
            .expect("every B waiter gets its lock");
        wakes.push((n, at.saturating_duration_since(released[&n])));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = churners.into_iter().map(|c| c.joined()).sum();
    for waiter in waiters {
        waiter.joined();
    }
    let (p50, p99, max) = percentiles(wakes.iter().map(|(_, wake)| *wake).collect());
    println!(
        "{NAMES} names with {rounds} joins and leaves meanwhile: B woken after release p50 \
         {p50:?} p99 {p99:?} max {max:?}"
    );
    let late: Vec<_> = wakes
        .iter()
        .filter(|(_, wake)| *wake > Duration::from_millis(200))
        .collect();
    assert!(late.is_empty(), "woken late (a lost wake-up): {late:?}");
}

/// The waiting cost does not grow with the number of waiters: 32 threads
/// of one client wait for 32 names another client holds (renewed leases,
/// so no lease ends meanwhile). Once they are parked, over 1.5 s (7.5 ×
/// `max_park`) they send no script call of their own beyond one look each
/// (their backstop is 10 × `max_park`, 2 s): a sweep of one `EXISTS` per
/// `max_park` checks every name for them. Looking every `max_park` each
/// would send about 240 script calls.
#[test]
fn parked_waiters_leave_the_looking_to_one_sweep_per_max_park() {
    let deployment = Deployment::start(Topology::Single);
    waiters_leave_the_looking_to_the_sweep(&deployment, &[deployment.server()], |_| 1);
}

/// The same on a Cluster: each node sweeps the names of its slots, one
/// `EXISTS` per slot (a multi-key command must stay within one slot).
#[cfg(feature = "cluster")]
#[test]
fn on_a_cluster_parked_waiters_leave_the_looking_to_each_nodes_sweep() {
    let deployment = Deployment::start(Topology::Cluster);
    let cluster = deployment.cluster();
    let masters: Vec<&RedisServer> = cluster.masters().iter().collect();
    // One EXISTS per slot of the names.
    let per_sweep = |names: &[String]| {
        let slots: std::collections::BTreeSet<u16> = names
            .iter()
            .map(|name| cluster.slot_of(&crate::support::lock_key(name)))
            .collect();
        slots.len() as u64
    };
    waiters_leave_the_looking_to_the_sweep(&deployment, &masters, per_sweep);
}

/// The body of the tests above, on `deployment`, whose masters are
/// `servers`; a sweep sends `per_sweep(names)` `EXISTS` (one on one
/// server).
fn waiters_leave_the_looking_to_the_sweep(
    deployment: &Deployment,
    servers: &[&RedisServer],
    per_sweep: impl Fn(&[String]) -> u64,
) {
    const WAITERS: usize = 32;
    const MAX_PARK: Duration = Duration::from_millis(200);
    const WINDOW: Duration = Duration::from_millis(1_500);
    let holder = deployment.client();
    let waiting = deployment.builder().max_park(MAX_PARK).build().unwrap();
    let names: Vec<String> = (0..WAITERS).map(|n| format!("swept:{n}")).collect();
    let guards: Vec<_> = names
        .iter()
        .map(|name| holder.lock(name).unwrap().lock().unwrap())
        .collect();
    let (acquired, acquisitions) = mpsc::channel();
    let waiters: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = waiting.lock(name).unwrap();
            let acquired = acquired.clone();
            thread::spawn(move || {
                let guard = lock.try_lock_for(Duration::from_secs(30)).unwrap();
                acquired.send(guard.is_some()).unwrap();
            })
        })
        .collect();
    // Parked: every name marked as waited for by its waiter's attempt.
    crate::support::eventually(Duration::from_secs(10), "every waiter parked", || {
        names.iter().all(|name| {
            let key = crate::support::lock_key(name);
            let waited: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg("waited")
                .query(&mut deployment.server_for(&key).connection())
                .unwrap();
            waited.is_some()
        })
    });
    let before: Vec<_> = servers
        .iter()
        .map(|server| server.command_calls())
        .collect();
    thread::sleep(WINDOW);
    let mut during: BTreeMap<String, u64> = BTreeMap::new();
    for (server, before) in servers.iter().zip(&before) {
        for (command, calls) in server.commands_since(before) {
            *during.entry(command).or_default() += calls;
        }
    }
    for guard in guards {
        guard.unlock().unwrap();
    }
    for _ in 0..WAITERS {
        assert!(acquisitions
            .recv_timeout(Duration::from_secs(30))
            .expect("every waiter ends"));
    }
    for waiter in waiters {
        waiter.joined();
    }
    let scripts =
        during.get("evalsha").copied().unwrap_or(0) + during.get("eval").copied().unwrap_or(0);
    let sweeps = during.get("exists").copied().unwrap_or(0);
    println!(
        "{WAITERS} waiters over {WINDOW:?}: {scripts} script calls, {sweeps} EXISTS; {during:?}"
    );
    // The holder's watchdog renews its 32 leases (one pipelined round of
    // scripts per 10 s: at most one in the window).
    assert!(
        scripts <= 2 * WAITERS as u64,
        "{scripts} script calls: the waiters look on their own ({during:?})"
    );
    let per_sweep = per_sweep(&names);
    let most_sweeps = (WINDOW.as_millis() / MAX_PARK.as_millis()) as u64 + 2;
    assert!(
        (1..=most_sweeps * per_sweep).contains(&sweeps),
        "{sweeps} EXISTS, expected one sweep per max_park ({during:?})"
    );
}

crate::across_topologies! {
    /// A lock that vanishes without a baton (deleted by hand; the same as a
    /// baton taken by a process that died before using it) is noticed by
    /// its parked waiter within about one `max_park`: on one server and
    /// Sentinel through the sweep, not at the waiter's own backstop (10 ×
    /// `max_park`); on a Cluster and a quorum by the waiter's own look.
    fn a_lock_gone_without_a_baton_is_noticed_within_a_max_park(deployment) {
        const MAX_PARK: Duration = Duration::from_millis(300);
        let holder = deployment.client();
        let waiting = deployment.builder().max_park(MAX_PARK).build().unwrap();
        let held = holder.lock("vanishing").unwrap().lock().unwrap();
        let lock = waiting.lock("vanishing").unwrap();
        let waiter = thread::spawn(move || {
            let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
            (guard.is_some(), Instant::now())
        });
        let key = crate::support::lock_key("vanishing");
        let servers = deployment.servers_for(&key);
        crate::support::eventually(Duration::from_secs(10), "the waiter parked", || {
            servers.iter().any(|server| {
                let waited: Option<String> = redis::cmd("HGET")
                    .arg(&key)
                    .arg("waited")
                    .query(&mut server.connection())
                    .unwrap();
                waited.is_some()
            })
        });
        // Let it settle into its park, then take the lock away without a
        // baton.
        thread::sleep(MAX_PARK);
        for server in &servers {
            let _: u32 = redis::cmd("DEL").arg(&key).query(&mut server.connection()).unwrap();
        }
        let gone = Instant::now();
        let (acquired, at) = waiter.joined();
        assert!(acquired, "the waiter got the lock");
        let noticed = at.saturating_duration_since(gone);
        println!("noticed {noticed:?} after the lock vanished");
        assert!(
            noticed < MAX_PARK * 4,
            "noticed {noticed:?} after the lock vanished (max_park {MAX_PARK:?})"
        );
        drop(held);
    }
}

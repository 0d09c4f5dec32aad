//! Between real processes: these tests re-run this test binary as child
//! processes (see `child_entry`), on every topology. Children count who is
//! inside on a data server of their own, apart from the deployment.

use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::support::{spawn_child_at, Deployment, JoinWithin, Topology};
use redbaton::Client;
use testkit::RedisServer;

/// This file's child-process roles (run by the binary's `child_entry`);
/// false for a role of another file.
pub(crate) fn run_child(role: &str, address: &str) -> bool {
    match role {
        "count-single" => count_worker(address, false),
        "count-mixed" => count_worker(address, true),
        "hold-two" => hold_worker(address),
        _ => return false,
    }
    true
}

const TOTAL: u64 = 3;
const CHILDREN: usize = 3;
const THREADS_PER_CHILD: usize = 4;
const ROUNDS_PER_THREAD: usize = 20;

/// What a child is told: the deployment and the data server, as text.
fn address(deployment: &Deployment, data: &RedisServer) -> String {
    let deployment = match deployment.topology() {
        Topology::Single => format!("single {}", deployment.server().url()),
        #[cfg(feature = "cluster")]
        Topology::Cluster => format!("cluster {}", deployment.cluster().seed_urls().join(",")),
        #[cfg(feature = "sentinel")]
        Topology::Sentinel => format!(
            "sentinel {}",
            deployment.sentinels().sentinel_urls().join(",")
        ),
        #[cfg(feature = "redlock")]
        Topology::Masters => unreachable!("a semaphore needs one deployment"),
    };
    format!("{deployment} {}", data.url())
}

/// A client builder for the deployment of `address`, and the data server's
/// URL.
fn from_address(address: &str) -> (redbaton::ClientBuilder, String) {
    let parts: Vec<&str> = address.split(' ').collect();
    let [kind, urls, data] = parts[..] else {
        panic!("bad child address {address:?}");
    };
    let urls: Vec<&str> = urls.split(',').collect();
    let topology = match kind {
        "single" => redbaton::Topology::server(urls[0]),
        #[cfg(feature = "cluster")]
        "cluster" => redbaton::Topology::cluster(urls),
        #[cfg(feature = "sentinel")]
        "sentinel" => redbaton::Topology::sentinel(crate::support::SERVICE, urls),
        _ => panic!("unknown deployment {kind}"),
    };
    let builder = Client::builder(topology).io_timeout(Duration::from_secs(5));
    (builder, data.to_owned())
}

/// Four threads take permits (one each, or one and two in turn when
/// `mixed`) `ROUNDS_PER_THREAD` times, and count on the data server how many
/// are held at once.
fn count_worker(address: &str, mixed: bool) {
    let (builder, data) = from_address(address);
    let client = builder.build().unwrap();
    let sem = client.semaphore("shared").unwrap();
    sem.try_set_permits(TOTAL).unwrap();
    let mut raw = redis::Client::open(data.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    println!("READY");
    // Start together with the other children, so that they really contend.
    let _: (String, String) = redis::cmd("BLPOP")
        .arg("go")
        .arg(30)
        .query(&mut raw)
        .unwrap();
    let workers: Vec<_> = (0..THREADS_PER_CHILD)
        .map(|thread| {
            let (sem, data) = (sem.clone(), data.clone());
            thread::spawn(move || {
                let mut raw = redis::Client::open(data).unwrap().get_connection().unwrap();
                let mut over = 0;
                for round in 0..ROUNDS_PER_THREAD {
                    let k = if mixed {
                        1 + ((thread + round) % 2) as u64
                    } else {
                        1
                    };
                    let permit = sem
                        .try_acquire_many_for(k, Duration::from_secs(60))
                        .unwrap()
                        .expect("permits within a minute");
                    let inside: u64 = redis::cmd("INCRBY")
                        .arg("inside")
                        .arg(k)
                        .query(&mut raw)
                        .unwrap();
                    if inside > TOTAL {
                        over += 1;
                    }
                    thread::sleep(Duration::from_millis(2));
                    redis::cmd("DECRBY")
                        .arg("inside")
                        .arg(k)
                        .query::<()>(&mut raw)
                        .unwrap();
                    redis::cmd("INCRBY")
                        .arg("taken")
                        .arg(k)
                        .query::<()>(&mut raw)
                        .unwrap();
                    redis::cmd("INCR")
                        .arg("acquisitions")
                        .query::<()>(&mut raw)
                        .unwrap();
                    permit.release().unwrap();
                }
                over
            })
        })
        .collect();
    let over: u32 = workers.into_iter().map(|worker| worker.joined()).sum();
    println!("RESULT {over}");
}

/// Takes two permits with a 1 s lease, says so, and waits to be killed.
fn hold_worker(address: &str) {
    let (builder, _) = from_address(address);
    let client = builder
        .default_lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let permits = client.semaphore("crash").unwrap().acquire_many(2).unwrap();
    println!("ACQUIRED {}", permits.num_permits());
    thread::sleep(Duration::from_secs(30));
    panic!("the test should have killed this process");
}

/// Runs `role` in three children against `deployment`; returns the data
/// server, on which they counted.
fn run_counters(deployment: &Deployment, role: &str) -> RedisServer {
    let data = RedisServer::start();
    let address = address(deployment, &data);
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|_| spawn_child_at(role, address.clone()))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(60));
    }
    let mut raw = data.connection();
    let go: Vec<usize> = (0..CHILDREN).collect();
    redis::cmd("RPUSH")
        .arg("go")
        .arg(&go)
        .query::<()>(&mut raw)
        .unwrap();
    for child in &mut children {
        let result = child.wait_for_line("RESULT", Duration::from_secs(180));
        assert_eq!(
            result.trim(),
            "0",
            "a child saw more than {TOTAL} permits held at once"
        );
    }
    let acquisitions: u64 = redis::cmd("GET")
        .arg("acquisitions")
        .query(&mut raw)
        .unwrap();
    assert_eq!(
        acquisitions,
        (CHILDREN * THREADS_PER_CHILD * ROUNDS_PER_THREAD) as u64
    );
    let inside: u64 = redis::cmd("GET").arg("inside").query(&mut raw).unwrap();
    assert_eq!(inside, 0);
    let client = deployment.client();
    assert_eq!(
        client
            .semaphore("shared")
            .unwrap()
            .available_permits()
            .unwrap(),
        TOTAL
    );
    data
}

across_topologies! { but_masters;
    /// Three processes of four threads on three permits: never more than
    /// three held at once, and every acquisition counted.
    fn three_processes_of_four_threads_never_hold_more_than_the_total(deployment) {
        run_counters(deployment, "count-single");
    }
}

across_topologies! { but_masters;
    /// The same with one and two permits at a time, in turn.
    fn single_and_double_acquisitions_never_hold_more_than_the_total(deployment) {
        let data = run_counters(deployment, "count-mixed");
        let mut raw = data.connection();
        let taken: u64 = redis::cmd("GET").arg("taken").query(&mut raw).unwrap();
        let rounds = (CHILDREN * THREADS_PER_CHILD * ROUNDS_PER_THREAD) as u64;
        assert_eq!(taken, rounds * 3 / 2, "half the rounds took two");
    }
}

across_topologies! { but_masters;
    /// A holder process killed with SIGKILL gives its permits back when
    /// their lease ends: a waiter for both gets them then.
    fn a_killed_holders_permits_return_when_their_lease_ends(deployment) {
        let data = RedisServer::start();
        let client = deployment.client();
        let sem = client.semaphore("crash").unwrap();
        sem.try_set_permits(2).unwrap();
        let mut holder = spawn_child_at("hold-two", address(deployment, &data));
        assert_eq!(holder.wait_for_line("ACQUIRED", Duration::from_secs(60)).trim(), "2");
        let acquired_at = Instant::now();
        holder.kill();
        let killed_at = Instant::now();
        assert_eq!(sem.available_permits().unwrap(), 0);
        let permits = sem
            .try_acquire_many_for(2, Duration::from_secs(10))
            .unwrap()
            .expect("the dead holder's permits");
        let after_kill = killed_at.elapsed();
        let after_acquisition = acquired_at.elapsed();
        // The last renewal came at the latest at the kill, the lease is 1 s.
        assert!(
            after_kill < Duration::from_millis(1_500),
            "acquired {after_kill:?} after the kill of a holder with a 1 s lease"
        );
        assert!(
            after_acquisition > Duration::from_millis(700),
            "acquired {after_acquisition:?} after the holder: its lease was not respected"
        );
        assert_eq!(permits.num_permits(), 2);
    }
}

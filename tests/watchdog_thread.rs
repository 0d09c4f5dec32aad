//! One watchdog thread per client renews many locks in shared round trips
//! and ends with the client. Alone in its binary, so that no other test's
//! threads are counted.

mod support;

use std::fs;
use std::thread;
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;

/// Threads of this process with the given name, from /proc.
fn threads_named(name: &str) -> usize {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|task| {
            let comm = task.as_ref().unwrap().path().join("comm");
            fs::read_to_string(comm)
                .map(|c| c.trim() == name)
                .unwrap_or(false)
        })
        .count()
}

fn all_threads() -> usize {
    fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn two_hundred_locks_are_renewed_by_one_thread_in_shared_rounds_and_it_ends_with_the_client() {
    const LOCKS: u64 = 200;
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let client = Client::builder(server.url())
        .default_lease(lease)
        .build()
        .unwrap();
    assert_eq!(
        threads_named("redbaton-watchd"),
        0,
        "started on first need only"
    );

    let guards: Vec<_> = (0..LOCKS)
        .map(|i| client.lock(&format!("many:{i}")).unwrap().lock().unwrap())
        .collect();
    let threads_holding = all_threads();
    let before = client.watchdog_stats();
    let commands_before = server.command_calls();
    thread::sleep(3 * lease); // the situation: renewals at every third of the lease
    let stats = client.watchdog_stats();
    let commands = server.commands_since(&commands_before);

    // Linux shows thread names cut to 15 bytes.
    assert_eq!(threads_named("redbaton-watchd"), 1);
    assert!(all_threads() <= threads_holding, "no thread per lock");
    let rounds = stats.rounds - before.rounds;
    let renewals = stats.renewals - before.renewals;
    println!("{rounds} rounds renewed {renewals} leases; commands {commands:?}");
    assert!(
        renewals >= LOCKS * 6,
        "every lock renewed about every 300 ms: {stats:?}"
    );
    assert!(
        rounds * LOCKS / 2 <= renewals,
        "most rounds renew all locks in one pipeline: {stats:?}"
    );
    // One EVALSHA per renewal, no other client command while holding.
    assert_eq!(commands.get("evalsha").copied(), Some(renewals));
    assert!(guards.iter().all(|g| !g.is_lost()));

    drop(guards);
    drop(client);
    support::eventually(Duration::from_secs(5), "the watchdog thread to end", || {
        threads_named("redbaton-watchd") == 0
    });
}

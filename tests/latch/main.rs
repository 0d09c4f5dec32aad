//! The count-down latch: every waiter of every process released once, none
//! early; no lost wake-up when a waiter arrives as the count hits zero;
//! rounds; what waiting costs; bad input. Child processes re-run this
//! binary on `child_entry`.

#[path = "../support/mod.rs"]
mod support;

mod rounds;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redbaton::{Client, Error};
use testkit::RedisServer;

use crate::support::{spawn_child, Deployment, JoinWithin};

/// Waiting threads per child process.
const THREADS_PER_CHILD: usize = 4;

/// Milliseconds since the epoch: one clock for every process of the test.
fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[
        |role, url| match role {
            "latch_waiter" => {
                latch_waiter(url);
                true
            }
            _ => false,
        },
        rounds::run_child,
    ]);
}

/// Four threads wait on the latch "start"; each says when it was released
/// and what count it then saw. Parks last 30 s: only the token wakes them
/// in time.
fn latch_waiter(url: &str) {
    let client = Client::builder(url)
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let latch = client.count_down_latch("start").unwrap();
    let waiters: Vec<_> = (0..THREADS_PER_CHILD)
        .map(|_| {
            let latch = latch.clone();
            thread::spawn(move || {
                let opened = latch.wait_for(Duration::from_secs(60)).unwrap();
                let at = epoch_ms();
                (opened, at, latch.count().unwrap())
            })
        })
        .collect();
    println!("READY");
    for waiter in waiters {
        let (opened, at, count) = waiter.joined();
        println!("RELEASED {opened} {at} {count}");
    }
}

#[test]
fn every_waiter_of_every_process_is_released_once_and_none_early() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let latch = client.count_down_latch("start").unwrap();
    assert!(latch.try_set_count(3).unwrap());
    let mut children: Vec<_> = (0..3)
        .map(|_| spawn_child("latch_waiter", &server))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    // Let the waiters park (creating the situation, not synchronising).
    thread::sleep(Duration::from_millis(300));
    assert_eq!(latch.count_down().unwrap(), 2);
    assert_eq!(latch.count_down().unwrap(), 1);
    thread::sleep(Duration::from_millis(200));
    let before_last = epoch_ms();
    assert_eq!(latch.count_down().unwrap(), 0);
    let mut released = 0;
    for child in &mut children {
        let lines = child.lines_with_prefix_until_exit("RELEASED", Duration::from_secs(30));
        assert_eq!(lines.len(), THREADS_PER_CHILD, "{lines:?}");
        for line in lines {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields[0], "true", "released by the latch: {line}");
            let at: u128 = fields[1].parse().unwrap();
            assert!(
                at >= before_last,
                "released before the last count-down: {line}"
            );
            // The token reaches every process at once; a broken chain
            // shows as a 30 s park.
            assert!(
                at < before_last + 2_000,
                "released {} ms after the last count-down",
                at - before_last
            );
            assert_eq!(fields[2], "0", "saw the latch open: {line}");
            released += 1;
        }
    }
    assert_eq!(released, 3 * THREADS_PER_CHILD);
}

across_topologies! {
    but_masters;
    /// A round: the count goes down to zero and stays there; a new round
    /// may start only then, and removes what the last one left.
    fn a_round_counts_down_to_zero_and_only_then_can_start_again(deployment) {
        let client = deployment.client();
        let latch = client.count_down_latch("rounds").unwrap();
        assert_eq!(latch.count().unwrap(), 0, "a latch nobody set is open");
        assert!(latch.wait_for(Duration::ZERO).unwrap());
        assert!(latch.try_set_count(2).unwrap());
        assert!(!latch.try_set_count(5).unwrap(), "refused while counting");
        assert_eq!(latch.count().unwrap(), 2);
        assert!(!latch.wait_for(Duration::from_millis(50)).unwrap());
        assert_eq!(latch.count_down().unwrap(), 1);
        assert_eq!(latch.count_down().unwrap(), 0);
        assert_eq!(latch.count_down().unwrap(), 0, "an open latch stays open");
        assert!(latch.wait_for(Duration::ZERO).unwrap());
        assert!(latch.try_set_count(1).unwrap(), "a new round after zero");
        // The new round waits on a baton of its own, with no token on it
        // (the last round's token stays, for that round's waiters, until
        // its TTL): see rounds.rs.
        let round_key = rounds::latch_key("rounds", "round");
        let mut raw = deployment.server_for(&round_key).connection();
        let round: String = redis::cmd("GET").arg(&round_key).query(&mut raw).unwrap();
        let baton = rounds::latch_key("rounds", &format!("baton:{round}"));
        let tokens: u32 = redis::cmd("EXISTS").arg(&baton).query(&mut raw).unwrap();
        assert_eq!(tokens, 0, "no token for the new round");
        assert!(!latch.wait_for(Duration::from_millis(50)).unwrap());
        assert_eq!(latch.count_down().unwrap(), 0);
    }
}

across_topologies! {
    but_masters;
    /// Waiters parked for much longer than the test: only the token can
    /// wake them, and it does, in every process (three clients here).
    fn opening_wakes_parked_waiters_of_every_client_at_once(deployment) {
        let clients: Vec<Client> = (0..3)
            .map(|_| deployment.builder().max_park(Duration::from_secs(30)).build().unwrap())
            .collect();
        let latch = clients[0].count_down_latch("gate").unwrap();
        latch.try_set_count(1).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiters: Vec<_> = clients
            .iter()
            .flat_map(|client| (0..2).map(move |_| client.count_down_latch("gate").unwrap()))
            .map(|latch| {
                let tx = tx.clone();
                thread::spawn(move || {
                    let opened = latch.wait_for(Duration::from_secs(20)).unwrap();
                    tx.send((opened, Instant::now())).unwrap();
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(300));
        let opened_at = Instant::now();
        latch.count_down().unwrap();
        for _ in 0..waiters.len() {
            let (opened, at) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            assert!(opened);
            let after = at.duration_since(opened_at);
            assert!(after < Duration::from_secs(3), "woken {after:?} after opening");
        }
        for waiter in waiters {
            waiter.joined();
        }
    }
}

#[test]
fn a_waiter_arriving_as_the_count_hits_zero_is_never_left_asleep() {
    let server = RedisServer::start();
    // Only a token can end a park early: a lost one shows as a 30 s wait.
    let client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let counter = support::client(&server);
    for round in 0..40u32 {
        let name = format!("race-{round}");
        let latch = client.count_down_latch(&name).unwrap();
        latch.try_set_count(1).unwrap();
        let other = counter.count_down_latch(&name).unwrap();
        let opener = thread::spawn(move || {
            // From 0 to ~2 ms after the waiter starts.
            thread::sleep(Duration::from_micros(50 * u64::from(round)));
            other.count_down().unwrap()
        });
        let started = Instant::now();
        assert!(
            latch.wait_for(Duration::from_secs(10)).unwrap(),
            "round {round}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "round {round}: woken after {:?}",
            started.elapsed()
        );
        assert_eq!(opener.joined(), 0);
    }
}

#[test]
fn twenty_waiting_clients_during_three_seconds_send_a_bounded_number_of_commands() {
    const WAITERS: u64 = 20;
    const HOLD: Duration = Duration::from_secs(3);
    const MAX_PARK: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let setter = support::client(&server);
    let latch = setter.count_down_latch("slow").unwrap();
    latch.try_set_count(1).unwrap();
    // A client each: twenty processes' worth of parked waiters.
    let clients: Vec<Client> = (0..WAITERS)
        .map(|_| {
            Client::builder(server.url())
                .max_park(MAX_PARK)
                .build()
                .unwrap()
        })
        .collect();
    let before = server.command_calls();
    let waiters: Vec<_> = clients
        .iter()
        .map(|client| {
            let latch = client.count_down_latch("slow").unwrap();
            thread::spawn(move || latch.wait_for(Duration::from_secs(30)).unwrap())
        })
        .collect();
    thread::sleep(HOLD);
    let during = server.commands_since(&before);
    latch.count_down().unwrap();
    for waiter in waiters {
        assert!(waiter.joined());
    }
    // What the clients sent (INFO commandstats also counts the GET that
    // the scripts run inside the server).
    let sent = ["evalsha", "eval", "script|load", "blpop"];
    let total: u64 = sent.iter().filter_map(|c| during.get(*c)).sum();
    // Per waiter: a first look and its first park, then a look and a park
    // per max park.
    let parks = HOLD.as_millis() as u64 / MAX_PARK.as_millis() as u64;
    let bound = WAITERS * (4 + 2 * parks);
    println!("commands during the wait: {total} (bound {bound}): {during:?}");
    assert!(total <= bound, "{total} > {bound}: {during:?}");
}

#[test]
fn bad_counts_damaged_keys_and_a_quorum_are_clear_errors() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let latch = client.count_down_latch("bad").unwrap();
    for count in [0, (1 << 53) + 1, u64::MAX] {
        let err = latch.try_set_count(count).unwrap_err();
        assert!(
            matches!(err, Error::InvalidCount { count: c } if c == count),
            "{err:?}"
        );
    }
    assert!(matches!(
        client.count_down_latch(""),
        Err(Error::InvalidName { .. })
    ));
    let mut raw = server.connection();
    redis::cmd("HSET")
        .arg("redbaton:{bad}:latch:count")
        .arg("f")
        .arg("v")
        .query::<()>(&mut raw)
        .unwrap();
    for err in [
        latch.try_set_count(1).map(|_| ()).unwrap_err(),
        latch.count_down().map(|_| ()).unwrap_err(),
        latch.count().map(|_| ()).unwrap_err(),
        latch
            .wait_for(Duration::from_millis(10))
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    }
    redis::cmd("SET")
        .arg("redbaton:{bad}:latch:count")
        .arg("three")
        .query::<()>(&mut raw)
        .unwrap();
    for err in [
        latch.count_down().map(|_| ()).unwrap_err(),
        latch.count().map(|_| ()).unwrap_err(),
    ] {
        assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    }
    #[cfg(feature = "redlock")]
    {
        let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let quorum = Client::builder(redbaton::Topology::masters(
            masters.iter().map(RedisServer::url),
        ))
        .build()
        .unwrap();
        let err = quorum
            .count_down_latch("q")
            .unwrap()
            .count_down()
            .unwrap_err();
        assert!(matches!(err, Error::WrongTopology { .. }), "{err:?}");
    }
    let _ = Deployment::start;
}

/// Issue 21, item 1: a count-down that reached the old master only (its
/// replica's link is down) is sent again to the promoted replica after a
/// failover, so the latch opens there instead of staying one short.
#[cfg(feature = "sentinel")]
#[test]
fn a_count_down_the_replica_missed_is_sent_again_to_the_new_master() {
    count_down_missed_then_failover(None);
}

/// The same when the failover comes after the client's default lease: a
/// count-down has no lease, and its resend outlasts one (a lost count-down
/// would keep the round shut for good).
#[cfg(feature = "sentinel")]
#[test]
fn a_count_down_is_sent_again_for_longer_than_the_default_lease() {
    count_down_missed_then_failover(Some(Duration::from_secs(1)));
}

/// Counts down with the replica cut off, then fails over to it, `lease`
/// (the client's default lease) and a half after the count-down when one
/// is given.
#[cfg(feature = "sentinel")]
fn count_down_missed_then_failover(lease: Option<Duration>) {
    use support::{cut_replica, eventually, Topology, SERVICE};
    let deployment = Deployment::start(Topology::Sentinel);
    let sentinels = deployment.sentinels();
    let mut builder = deployment
        .builder()
        .replica_acks(1, Duration::from_millis(300));
    if let Some(lease) = lease {
        builder = builder.default_lease(lease);
    }
    let client = builder.build().unwrap();
    let latch = client.count_down_latch("counted-before-failover").unwrap();
    assert!(latch.try_set_count(1).unwrap());
    support::wait_for_replica(sentinels.master(), "test-sync");
    cut_replica(sentinels);
    let counted = latch.count_down();
    println!("count_down: {counted:?}");
    assert!(
        matches!(counted, Ok(0) | Err(Error::NotReplicated { .. })),
        "{counted:?}"
    );
    if let Some(lease) = lease {
        // The event under test is time itself: the lease passing.
        std::thread::sleep(lease + lease / 2);
    }
    let old = sentinels.master().port();
    let started = Instant::now();
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query::<()>(&mut sentinels.sentinels()[0].connection())
        .unwrap();
    eventually(Duration::from_secs(20), "the replica is promoted", || {
        sentinels.current_master_port().is_some_and(|p| p != old)
    });
    let other = deployment.client();
    let opened = other
        .count_down_latch("counted-before-failover")
        .unwrap()
        .wait_for(Duration::from_secs(15))
        .unwrap();
    println!(
        "open on the new master {:?} after SENTINEL FAILOVER",
        started.elapsed()
    );
    assert!(opened, "the latch opened on the new master");
}

/// The commands docs/security.md adds to the lock's ACL line for the
/// count-down latch.
const LATCH_ACL: &str = "+decr +sadd";

/// The ACL line plus the latch's commands, as docs/security.md states
/// them: a latch works under a user limited to them (setting the count, a
/// waiter of another client parked until the last count-down, the count).
#[test]
fn everything_works_under_a_user_limited_to_the_documented_acl() {
    assert!(
        support::security_page_says(LATCH_ACL),
        "docs/security.md lists {LATCH_ACL}"
    );
    let server = RedisServer::start();
    let url = support::documented_acl_user(&server, "latch", LATCH_ACL);
    let (client, other) = (Client::open(&url).unwrap(), Client::open(&url).unwrap());
    let latch = client.count_down_latch("acl").unwrap();
    assert!(latch.try_set_count(2).unwrap());
    let waiting = other.count_down_latch("acl").unwrap();
    let handle = thread::spawn(move || waiting.wait_for(Duration::from_secs(5)));
    assert_eq!(latch.count_down().unwrap(), 1);
    assert_eq!(latch.count().unwrap(), 1);
    assert_eq!(latch.count_down().unwrap(), 0);
    assert!(handle.joined().unwrap(), "the waiter saw the latch open");
}

//! Rounds in quick succession: a round re-armed at once after it opened
//! still wakes every waiter it had, in every process; a count-down sent
//! again after its round ended never counts in the next; a new round's
//! waiters are not woken by the last round's token.

use std::thread;
use std::time::{Duration, Instant};

use redbaton::Client;
use testkit::{FaultProxy, RedisServer};

use crate::support::{self, spawn_child, JoinWithin};

/// Rounds the re-arming test runs.
const ROUNDS: usize = 6;
/// Waiting threads per child process in the re-arming test.
const THREADS: usize = 2;
/// How long a child waits in one round before it gives up: far longer
/// than a token takes, far shorter than the children's parks (30 s), so a
/// lost wake-up shows as a timed-out round.
const ROUND_WAIT: Duration = Duration::from_secs(3);

/// The roles of this file's child processes.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "rearmed_waiter" => rearmed_waiter(url),
        _ => return false,
    }
    true
}

/// `THREADS` threads, each with a client of its own (so that each parks in
/// Redis, where the coordinator can see it), wait on the latch "rearmed"
/// once per round, each for `ROUND_WAIT` at most; parks last 30 s, so only
/// a token wakes them in time.
fn rearmed_waiter(url: &str) {
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let client = Client::builder(url)
                .max_park(Duration::from_secs(30))
                .build()
                .unwrap();
            thread::spawn(move || {
                let latch = client.count_down_latch("rearmed").unwrap();
                for round in 0..ROUNDS {
                    // Round `round` may not be set yet (a waiter of the last
                    // one can wake before the coordinator's next call).
                    support::eventually(Duration::from_secs(30), "the next round", || {
                        latch.count().unwrap() > 0
                    });
                    println!("WAITING {round} {thread}");
                    let started = Instant::now();
                    let opened = latch.wait_for(ROUND_WAIT).unwrap();
                    println!(
                        "WOKE {round} {thread} {opened} {}",
                        started.elapsed().as_millis()
                    );
                }
            })
        })
        .collect();
    for thread in threads {
        thread.joined();
    }
}

/// The key `part` of latch `name` under the default prefix.
pub(crate) fn latch_key(name: &str, part: &str) -> String {
    format!("redbaton:{{{}}}:latch:{part}", support::hash_tag(name))
}

/// The coordinator: each round opens with `count_down()` and the
/// next is set at once with `try_set_count(1)`. Every waiter parked when
/// its round opened wakes, in every process, within a fraction of a park.
#[test]
fn every_waiter_of_a_round_wakes_though_the_next_round_starts_at_once() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let latch = client.count_down_latch("rearmed").unwrap();
    assert!(latch.try_set_count(1).unwrap());
    let mut children: Vec<_> = (0..3)
        .map(|_| spawn_child("rearmed_waiter", &server))
        .collect();
    let (mut woken, mut slowest) = (0, 0u64);
    let mut late = Vec::new();
    for round in 0..ROUNDS {
        for child in &mut children {
            for _ in 0..THREADS {
                child.wait_for_line(&format!("WAITING {round} "), Duration::from_secs(30));
            }
        }
        // Every waiter parked in Redis: each has looked at this round.
        support::eventually(Duration::from_secs(10), "every waiter parked", || {
            support::parked(&server) == 3 * THREADS as u64
        });
        assert_eq!(latch.count_down().unwrap(), 0);
        assert!(latch.try_set_count(1).unwrap(), "the next round, at once");
        for child in &mut children {
            for _ in 0..THREADS {
                let line = child.wait_for_line(&format!("WOKE {round} "), Duration::from_secs(30));
                let fields: Vec<&str> = line.split(' ').collect();
                let waited: u64 = fields[2].parse().unwrap();
                if fields[1] == "true" {
                    woken += 1;
                    slowest = slowest.max(waited);
                } else {
                    late.push(format!("round {round}: {line}"));
                }
            }
        }
    }
    let waiters = ROUNDS * 3 * THREADS;
    println!("woken {woken}/{waiters}; slowest {slowest} ms; not woken: {late:?}");
    assert_eq!(woken, waiters, "waiters left asleep: {late:?}");
    // Waited includes the coordinator's wait for all to park.
    assert!(slowest < 2_500, "slowest wake-up {slowest} ms");
}

/// The case with the same script call sent twice by hand: the
/// count-down that opened round 1 is sent again after round 2 started at
/// 3, and leaves it at 3.
#[test]
fn a_count_down_sent_again_after_its_round_ended_does_not_count_in_the_next() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let latch = client.count_down_latch("resent").unwrap();
    assert!(latch.try_set_count(1).unwrap());
    let mut raw = server.connection();
    let round: String = redis::cmd("GET")
        .arg(latch_key("resent", "round"))
        .query(&mut raw)
        .unwrap();
    let count_down = |raw: &mut redis::Connection, id: &str| -> u64 {
        redis::cmd("EVAL")
            .arg(concat!(
                include_str!("../../src/scripts/lib/latch.lua"),
                include_str!("../../src/scripts/latch/count_down.lua")
            ))
            .arg(4)
            .arg(latch_key("resent", "count"))
            .arg(latch_key("resent", "round"))
            .arg(latch_key("resent", "applied"))
            .arg(latch_key("resent", &format!("baton:{round}")))
            .arg(id)
            .arg(&round)
            .arg(5_000)
            .arg(300_000)
            .query(raw)
            .unwrap()
    };
    assert_eq!(count_down(&mut raw, "worker:1"), 0, "round 1 opens");
    assert!(latch.try_set_count(3).unwrap(), "round 2 at 3");
    assert_eq!(count_down(&mut raw, "worker:1"), 0, "the resend");
    assert_eq!(latch.count().unwrap(), 3, "the resend counted in round 2");
    // Sent twice within a round, a count-down counts once too.
    assert_eq!(latch.count_down().unwrap(), 2);
    let round: String = redis::cmd("GET")
        .arg(latch_key("resent", "round"))
        .query(&mut raw)
        .unwrap();
    let twice = |raw: &mut redis::Connection| -> u64 {
        redis::cmd("EVAL")
            .arg(concat!(
                include_str!("../../src/scripts/lib/latch.lua"),
                include_str!("../../src/scripts/latch/count_down.lua")
            ))
            .arg(4)
            .arg(latch_key("resent", "count"))
            .arg(latch_key("resent", "round"))
            .arg(latch_key("resent", "applied"))
            .arg(latch_key("resent", &format!("baton:{round}")))
            .arg("worker:2")
            .arg(&round)
            .arg(5_000)
            .arg(300_000)
            .query(raw)
            .unwrap()
    };
    assert_eq!(twice(&mut raw), 1);
    assert_eq!(twice(&mut raw), 1, "sent twice, counted once");
    assert_eq!(latch.count().unwrap(), 1);
}

/// The hash the crate sends the count-down script by.
fn count_down_sha() -> String {
    redis::Script::new(concat!(
        include_str!("../../src/scripts/lib/latch.lua"),
        include_str!("../../src/scripts/latch/count_down.lua")
    ))
    .get_hash()
    .to_owned()
}

/// Through a proxy that loses the count-down's reply and holds the resend
/// up: the coordinator starts round 2 meanwhile, and the resend does not
/// count in it.
#[test]
fn a_count_down_whose_reply_was_lost_counts_once_across_a_re_arm() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let worker = Client::open(proxy.url().as_str()).unwrap();
    let coordinator = support::client(&server);
    let latch = coordinator.count_down_latch("lost").unwrap();
    // Load the script, so that the lost request is the one that runs.
    assert!(latch.try_set_count(2).unwrap());
    let counting = worker.count_down_latch("lost").unwrap();
    assert_eq!(counting.count_down().unwrap(), 1);
    proxy.drop_reply_to(count_down_sha().as_bytes());
    proxy.set_delay(Duration::from_millis(300));
    let resending = thread::spawn(move || counting.count_down());
    support::eventually(Duration::from_secs(10), "the lost reply", || {
        proxy.dropped_replies() == 1
    });
    assert!(
        latch.try_set_count(3).unwrap(),
        "round 2, before the resend"
    );
    assert_eq!(resending.joined().unwrap(), 0, "its round had ended");
    assert_eq!(latch.count().unwrap(), 3, "the resend counted in round 2");
    // Without a round in between: the resend finds its id.
    proxy.set_delay(Duration::ZERO);
    let counting = worker.count_down_latch("lost").unwrap();
    proxy.drop_reply_to(count_down_sha().as_bytes());
    assert_eq!(counting.count_down().unwrap(), 2);
    assert_eq!(proxy.dropped_replies(), 2);
    assert_eq!(latch.count().unwrap(), 2, "sent twice, counted once");
}

/// A `try_set_count` whose reply was lost is sent again, finds the round
/// it started, and says so: one round, and `true`.
#[test]
fn a_set_count_whose_reply_was_lost_starts_one_round_and_says_so() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = Client::open(proxy.url().as_str()).unwrap();
    let latch = client.count_down_latch("set-twice").unwrap();
    assert!(latch.try_set_count(1).unwrap());
    assert_eq!(latch.count_down().unwrap(), 0);
    let sha = redis::Script::new(concat!(
        include_str!("../../src/scripts/lib/latch.lua"),
        include_str!("../../src/scripts/latch/set_count.lua")
    ))
    .get_hash()
    .to_owned();
    proxy.drop_reply_to(sha.as_bytes());
    assert!(
        latch.try_set_count(2).unwrap(),
        "this call started the round"
    );
    assert_eq!(proxy.dropped_replies(), 1);
    assert_eq!(latch.count().unwrap(), 2);
}

/// A new round's waiters park on a baton of their own: the token the last
/// round left (it lives on for `baton_ttl`, for that round's waiters) wakes
/// none of them, and the new round's baton is empty.
#[test]
fn a_new_rounds_waiter_is_not_woken_by_the_last_rounds_token() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let waiter = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .build()
        .unwrap();
    let latch = client.count_down_latch("tokens").unwrap();
    let mut raw = server.connection();
    let round_key = latch_key("tokens", "round");
    assert!(latch.try_set_count(1).unwrap());
    let first: String = redis::cmd("GET").arg(&round_key).query(&mut raw).unwrap();
    assert_eq!(latch.count_down().unwrap(), 0);
    assert!(latch.try_set_count(1).unwrap());
    let new_round = waiter.count_down_latch("tokens").unwrap();
    assert!(!new_round.wait_for(Duration::from_millis(300)).unwrap());
    // Where the tokens are: the last round's still there (a waiter parked
    // on it would have popped it), until its TTL, for that round's
    // waiters; none for the new round. (Counting the waiter's BLPOPs
    // instead does not work: a parked connection's call, shared by every
    // name the client waits on, outlives the waiter's deadline, and a
    // server counts a blocked command only once it ends.)
    let old_baton = latch_key("tokens", &format!("baton:{first}"));
    let left: i64 = redis::cmd("LLEN").arg(&old_baton).query(&mut raw).unwrap();
    assert_eq!(left, 1, "the token the opening left, for parked waiters");
    let ttl: i64 = redis::cmd("PTTL").arg(&old_baton).query(&mut raw).unwrap();
    assert!(ttl > 0 && ttl <= 5_000, "the old token expires: PTTL {ttl}");
    let second: String = redis::cmd("GET").arg(&round_key).query(&mut raw).unwrap();
    assert_ne!(first, second);
    let new_baton = latch_key("tokens", &format!("baton:{second}"));
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&new_baton)
        .query(&mut raw)
        .unwrap();
    assert_eq!(exists, 0, "the new round's baton holds no token");
}

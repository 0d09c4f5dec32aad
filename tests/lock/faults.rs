//! Faults injected into a real redis-server: restarts with data loss,
//! pauses, killed connections, and replies lost after a script ran.

use crate::support;
use crate::support::{Deployment, Topology};

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::eventually;
use crate::support::JoinWithin;
use redbaton::Client;
use testkit::RedisServer;

#[test]
fn a_restart_that_loses_every_key_neither_hangs_waiters_nor_breaks_tokens_or_identities() {
    let server = RedisServer::start();
    let holder_client = Client::builder(server.url())
        .default_lease(Duration::from_millis(600))
        .io_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    // No local hand-offs: each waiter takes the lock in Redis under its own
    // identity, which shows whether identities stay unique.
    let waiter_client = Client::builder(server.url())
        .max_park(Duration::from_secs(30))
        .io_timeout(Duration::from_millis(500))
        .max_local_handoffs(0)
        .build()
        .unwrap();
    let lock = holder_client.lock("restarted").unwrap();
    let held = lock.lock().unwrap();
    let old_token = held.fencing_token();
    let old_owner = lock.holder().unwrap().unwrap().owner;

    let deadline = Duration::from_secs(6);
    let (tx, rx) = mpsc::channel();
    for _ in 0..3 {
        let (lock, tx) = (waiter_client.lock("restarted").unwrap(), tx.clone());
        thread::spawn(move || {
            let start = Instant::now();
            let outcome = lock.try_lock_for(deadline).map(|guard| {
                guard.map(|g| {
                    let token = g.fencing_token();
                    let owner = lock.holder().unwrap().unwrap().owner;
                    (token, owner)
                })
            });
            tx.send((outcome, start.elapsed())).unwrap();
        });
    }
    // One waiter parks in Redis for the three (the others wait in the
    // process's queue).
    eventually(Duration::from_secs(10), "the waiters park", || {
        support::parked(&server) == 1
    });
    server.restart();

    let mut acquired = Vec::new();
    for _ in 0..3 {
        let (outcome, waited) = rx
            .recv_timeout(Duration::from_secs(15))
            .expect("no waiter hangs");
        assert!(
            waited < deadline + Duration::from_secs(1),
            "waited {waited:?}"
        );
        match outcome {
            Ok(Some(got)) => acquired.push(got),
            Ok(None) => {}
            Err(err) => assert!(err.is_unreachable(), "{err}"),
        }
    }
    assert!(
        !acquired.is_empty(),
        "the lock is free again after the restart"
    );
    for (token, owner) in &acquired {
        assert!(
            *token > old_token,
            "tokens still increase after the counter was lost"
        );
        assert_ne!(*owner, old_owner);
    }
    // Identities stay unique although the INCR counter restarted.
    let mut owners: Vec<_> = acquired.iter().map(|(_, owner)| owner.clone()).collect();
    owners.sort();
    owners.dedup();
    assert_eq!(owners.len(), acquired.len(), "{acquired:?}");

    eventually(
        Duration::from_secs(3),
        "the old holder to learn it lost the lock",
        || held.is_lost(),
    );
    assert!(held.unlock().unwrap_err().is_lost());
    let again = lock.lock().unwrap();
    assert!(again.fencing_token() > old_token);
}

#[test]
fn a_paused_server_fails_parked_waiters_within_bounds_and_work_resumes_after() {
    let server = RedisServer::start();
    let io_timeout = Duration::from_millis(300);
    let client = Client::builder(server.url())
        .max_park(Duration::from_millis(500))
        .io_timeout(io_timeout)
        .build()
        .unwrap();
    let lock = client.lock("frozen").unwrap();
    let held = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            let start = Instant::now();
            let outcome = lock
                .try_lock_for(Duration::from_secs(2))
                .map(|g| g.is_some());
            (outcome, start.elapsed())
        })
    };
    eventually(Duration::from_secs(5), "the waiter parks", || {
        support::parked(&server) == 1
    });
    server.pause();
    let (outcome, waited) = waiter.joined();
    server.resume();
    // A waiter rides out a failing Redis until its deadline, then reports
    // the failure (not "someone else held it").
    let err = outcome.unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    // Its deadline, plus at most the I/O timeout of the attempt in flight
    // and its parked socket's grace.
    assert!(
        waited < Duration::from_secs(2) + 3 * io_timeout,
        "the waiter hung for {waited:?}"
    );

    // The same client works again without a restart of the program.
    held.unlock().unwrap();
    let guard = lock.try_lock().unwrap().expect("free");
    guard.unlock().unwrap();
}

/// Ids of the connections waiters park on: blocked in a command (`BLPOP`,
/// flag `b`), or subscribed to the server's announcements of changed
/// baton lists (a parking hub's listener, subscribed to those and to its
/// client's grants: `sub=2`).
fn blocked_client_ids(raw: &mut redis::Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(raw).unwrap();
    list.lines()
        .filter(|line| {
            line.split(' ').any(|field| {
                (field.starts_with("flags=") && field.contains('b'))
                    || (field.starts_with("sub=") && field != "sub=0")
            })
        })
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn a_killed_parked_connection_is_recovered_and_no_baton_is_lost() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    // A long maximum park: only batons can wake these waiters quickly.
    let waiter_client = |_: ()| {
        Client::builder(server.url())
            .max_park(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let holder = support::client(&server);
    let held = holder.lock("killed").unwrap().lock().unwrap();

    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let (lock, tx) = (waiter_client(()).lock("killed").unwrap(), tx.clone());
        thread::spawn(move || {
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .unwrap()
                .expect("acquired");
            thread::sleep(Duration::from_millis(50));
            tx.send(Instant::now()).unwrap();
            drop(guard);
        });
    }
    let mut blocked = Vec::new();
    eventually(Duration::from_secs(5), "two parked waiters", || {
        blocked = blocked_client_ids(&mut raw);
        blocked.len() == 2
    });
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&blocked[0])
        .query::<()>(&mut raw)
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "the killed waiter to park again",
        || {
            let now = blocked_client_ids(&mut raw);
            now.len() == 2 && !now.contains(&blocked[0])
        },
    );

    let released = Instant::now();
    held.unlock().unwrap();
    let first = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("a waiter woke on the baton");
    let second = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the other woke on the next baton");
    assert!(first.duration_since(released) < Duration::from_secs(2));
    assert!(second.duration_since(first) < Duration::from_secs(2));
}

#[test]
fn after_a_release_with_an_unknown_outcome_the_thread_takes_the_lock_afresh() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .io_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let lock = client.lock("unknown").unwrap();
    let guard = lock.lock().unwrap();
    let old_token = guard.fencing_token();
    let mut raw = server.connection();
    // Writes stall for 1 s: the release times out on the client, and its
    // connection is dropped with the script unanswered.
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("WRITE")
        .query::<()>(&mut raw)
        .unwrap();
    let err = guard.unlock().unwrap_err();
    assert!(err.is_unreachable() && err.is_timeout(), "{err}");
    eventually(Duration::from_secs(5), "the pause to end", || {
        redis::cmd("SET")
            .arg("probe")
            .arg(1)
            .query::<()>(&mut raw)
            .is_ok()
    });
    let leftover = lock.holder().unwrap();
    println!("after the lost reply the lock is {leftover:?}");

    // Whether or not the release ran, the thread now holds a fresh ownership
    // of depth 1, not a re-entry into the old one.
    let again = lock.lock().unwrap();
    assert!(again.fencing_token() > old_token);
    assert_eq!(lock.holder().unwrap().unwrap().depth, 1);
    again.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "one unlock frees it");
}

#[test]
fn the_release_script_sent_twice_takes_off_one_level_only() {
    let deployment = Deployment::start(Topology::Single);
    let (server, client) = (deployment.server(), deployment.client());
    let lock = client.lock("twice").unwrap();
    let guards = [
        lock.lock().unwrap(),
        lock.lock().unwrap(),
        lock.lock().unwrap(),
    ];
    let holder = lock.holder().unwrap().unwrap();
    assert_eq!(holder.depth, 3);
    let mut raw = server.connection();
    // The same release (one guard of three) as a retry would send it.
    for _ in 0..2 {
        let left: i64 = crate::scripts::script("release")
            .key(support::lock_key("twice"))
            .key(support::baton_key("twice"))
            .arg(holder.owner.as_str())
            .arg(holder.fencing_token)
            .arg(2)
            .arg(30_000)
            .arg(5_000)
            .arg(0)
            .invoke(&mut raw)
            .unwrap();
        assert_eq!(left, 2);
    }
    assert_eq!(lock.holder().unwrap().unwrap().depth, 2);
    drop(guards);
    assert!(!lock.is_locked().unwrap());
}

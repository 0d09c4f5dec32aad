//! Re-entry in both modes, downgrade (write, then read, then let the write
//! go), and the refused upgrade.

use std::time::{Duration, Instant};

use redbaton::Error;

use crate::across_topologies;
use crate::support;
use crate::{rw_key, rw_state};

across_topologies! {
    but_masters;
    /// A thread reads twice, then writes twice; each hold ends with its
    /// last guard, and another client is kept out (or let in) accordingly.
    fn both_modes_are_reentrant_per_thread(deployment) {
        let (mine, theirs) = (deployment.client(), deployment.client());
        let (lock, other) = (mine.rw_lock("re").unwrap(), theirs.rw_lock("re").unwrap());

        let outer = lock.read().unwrap();
        let inner = lock.try_read().unwrap().expect("a reader re-enters");
        assert!(other.try_write().unwrap().is_none());
        inner.unlock().unwrap();
        assert!(other.try_write().unwrap().is_none(), "one read guard is left");
        outer.unlock().unwrap();
        let theirs_write = other.try_write().unwrap().expect("free after the last read guard");
        let first_token = theirs_write.fencing_token();
        theirs_write.unlock().unwrap();

        let outer = lock.write().unwrap();
        let inner = lock.try_write_for(Duration::from_secs(1)).unwrap().expect("a writer re-enters");
        assert_eq!(outer.fencing_token(), inner.fencing_token(), "re-entry keeps the token");
        assert!(outer.fencing_token() > first_token, "a fresh write gets a larger token");
        assert!(other.try_read().unwrap().is_none());
        drop(inner);
        assert!(other.try_read().unwrap().is_none(), "one write guard is left");
        outer.unlock().unwrap();
        let read = other.try_read().unwrap().expect("free after the last write guard");
        read.unlock().unwrap();
    }
}

across_topologies! {
    but_masters;
    /// A writer takes read guards too; once its write guards are gone the
    /// lock is read-held: other readers join, writers stay out until the
    /// read guard goes.
    fn a_writer_that_reads_and_lets_the_write_go_keeps_the_lock_read_held(deployment) {
        let (mine, theirs) = (deployment.client(), deployment.client());
        let (lock, other) = (mine.rw_lock("down").unwrap(), theirs.rw_lock("down").unwrap());
        let write = lock.write().unwrap();
        let read = lock.try_read().unwrap().expect("a writer may read");
        assert!(other.try_read().unwrap().is_none(), "still written");
        write.unlock().unwrap();
        let shared = other.try_read().unwrap().expect("read-held: readers share it");
        shared.unlock().unwrap();
        assert!(other.try_write().unwrap().is_none(), "the downgraded reader still reads");
        read.unlock().unwrap();
        other.try_write().unwrap().expect("free").unlock().unwrap();
    }
}

across_topologies! {
    but_masters;
    /// A thread that only reads and asks to write is refused at once, by
    /// every form of write, without sending anything: Redis is unchanged.
    fn upgrading_a_read_hold_is_refused_and_changes_nothing(deployment) {
        let client = deployment.client();
        let lock = client.rw_lock("up").unwrap();
        let read = lock.read().unwrap();
        let server = deployment.server_for(&rw_key("up", "write"));
        let mut raw = server.connection();
        let before = rw_state(&mut raw, "up");
        let calls = server.command_calls();
        let started = Instant::now();
        let errors = [
            lock.write().unwrap_err(),
            lock.try_write().unwrap_err(),
            lock.try_write_for(Duration::from_secs(5)).unwrap_err(),
            lock.try_write_until(Instant::now() + Duration::from_secs(5)).unwrap_err(),
        ];
        assert!(started.elapsed() < Duration::from_secs(1), "refused at once");
        for err in errors {
            assert!(matches!(&err, Error::UpgradeRefused { name } if name == "up"), "{err:?}");
        }
        let sent = server.commands_since(&calls);
        let scripts: u64 = ["evalsha", "eval"].iter().filter_map(|c| sent.get(*c)).sum();
        assert_eq!(scripts, 0, "no script was sent: {sent:?}");
        assert_eq!(rw_state(&mut raw, "up"), before);
        // The read hold is intact; once it is gone, writing is fine.
        read.unlock().unwrap();
        lock.try_write().unwrap().expect("free").unlock().unwrap();
    }
}

/// The write script itself refuses an upgrade: run as sent (with its
/// helpers) for an identity whose read hold Redis has, it answers `{-2}`
/// and changes nothing; the same call without the read token takes the
/// write hold (the read hold was a leftover).
#[test]
fn the_write_script_refuses_an_upgrade_too() {
    let server = testkit::RedisServer::start();
    let mut raw = server.connection();
    let scripts = concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts/");
    let source: String = [
        "lib/rw.lua",
        "lib/next_fence.lua",
        "lib/lease.lua",
        "rwlock/write.lua",
    ]
    .iter()
    .map(|file| std::fs::read_to_string(format!("{scripts}{file}")).unwrap())
    .collect();
    let name = "scripted";
    let far: u64 = redis::cmd("TIME")
        .query::<(u64, u64)>(&mut raw)
        .map(|(s, _)| s * 1000 + 60_000)
        .unwrap();
    redis::cmd("ZADD")
        .arg(rw_key(name, "readers"))
        .arg(far)
        .arg("me")
        .query::<()>(&mut raw)
        .unwrap();
    redis::cmd("HSET")
        .arg(rw_key(name, "depths"))
        .arg("me")
        .arg("1:7")
        .query::<()>(&mut raw)
        .unwrap();
    let before = rw_state(&mut raw, name);
    let write = |raw: &mut redis::Connection, read_token: u64| -> Vec<i64> {
        redis::cmd("EVAL")
            .arg(&source)
            .arg(6)
            .arg(
                &[
                    "write",
                    "readers",
                    "depths",
                    "writers",
                    "fence",
                    "upgradable",
                ]
                .map(|part| rw_key(name, part)),
            )
            .arg(&["me", "30000", "0", "1", "60000", "1", "2500"])
            .arg(read_token)
            .query(raw)
            .unwrap()
    };
    assert_eq!(write(&mut raw, 7), vec![-2], "an upgrade");
    assert_eq!(rw_state(&mut raw, name), before, "nothing changed");
    let taken = write(&mut raw, 0);
    assert_eq!(
        (taken[0], taken[2]),
        (1, 1),
        "a leftover read hold does not block its own thread: {taken:?}"
    );
}

/// A writer whose own process has readers waiting for it may still read
/// (it does not queue behind them): no self-deadlock.
#[test]
fn a_writer_reads_at_once_while_readers_of_its_process_wait_for_it() {
    let server = testkit::RedisServer::start();
    let client = support::client(&server);
    let lock = client.rw_lock("busy-writer").unwrap();
    let write = lock.write().unwrap();
    let (ready, started) = std::sync::mpsc::channel();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (lock, ready) = (lock.clone(), ready.clone());
            std::thread::spawn(move || {
                // The thread's identity and a first look, then the wait.
                assert!(lock.try_read().unwrap().is_none());
                ready.send(support::thread_id()).unwrap();
                lock.try_read_for(Duration::from_secs(20))
                    .unwrap()
                    .is_some()
            })
        })
        .collect();
    let tids: Vec<u32> = (0..3)
        .map(|_| started.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    // They queue up behind the write hold: one parks, two wait locally.
    support::eventually(Duration::from_secs(10), "the readers queue", || {
        support::parked(&server) == 1 && tids.iter().all(|&tid| support::is_asleep(tid))
    });
    let started = Instant::now();
    let read = lock
        .try_read_for(Duration::from_secs(5))
        .unwrap()
        .expect("the writer reads");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    write.unlock().unwrap();
    for reader in readers {
        assert!(
            crate::support::JoinWithin::joined(reader),
            "readers get in after the write"
        );
    }
    read.unlock().unwrap();
}

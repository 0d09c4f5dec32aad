//! The fair lock while its slot migrates (feature `cluster`): every script
//! declares its keys, so a migration is transient (`ASK`, `TRYAGAIN`),
//! never "Script attempted to access a non local key", and the waiters
//! keep their places and their order across it.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use testkit::{RedisServer, SlotMigration};

use crate::queue_key;
use crate::support::{self, Deployment, JoinWithin, Topology};

/// The waiters in the queue of `name` on `node`, by arrival (`ASKING`
/// first: the node may be importing the slot).
fn queue_on(node: &RedisServer, name: &str) -> Vec<(String, f64)> {
    let mut con = node.connection();
    redis::cmd("ASKING").query::<()>(&mut con).unwrap();
    redis::cmd("ZRANGE")
        .arg(queue_key(name))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .unwrap()
}

/// A client of `deployment` whose waiters park at most 1 s. While the
/// slot's keys are split between the two nodes, every fair-lock script on
/// the slot is refused with TRYAGAIN, so no waiter can come back to keep
/// its place. A place lasts 1.5 `max_park` + 500 ms: with a 1 s park, 2 s,
/// well past a 500 ms split even on a loaded machine (with 200 ms, 800 ms,
/// which a loaded CI machine overran once: the head's place ended and the
/// second waiter went first).
fn client(deployment: &Deployment) -> redbaton::Client {
    deployment
        .builder()
        .max_park(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Issue 21 item 4: a holder releases while the slot is MIGRATING (no key
/// moved yet, as between two batches of a reshard), then the keys move
/// and the slot is handed over. The release succeeds, the two queued
/// waiters keep their places (same arrivals on the new master) and are
/// served in order, and nobody gets an error.
#[test]
fn a_fair_lock_rides_out_a_slot_migration_and_its_waiters_keep_their_places() {
    let deployment = Deployment::start(Topology::Cluster);
    let name = "moving";
    let migration = SlotMigration::of(deployment.cluster(), &queue_key(name));
    let from = migration.from;
    let holder = client(&deployment);
    let held = holder.fair_lock(name).unwrap().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let client = client(&deployment);
            let tx = tx.clone();
            let waiter = thread::spawn(move || {
                let got = client
                    .fair_lock(name)
                    .unwrap()
                    .try_lock_for(Duration::from_secs(30));
                let guard = got.unwrap().expect("served");
                tx.send(i).unwrap();
                guard.unlock().unwrap();
            });
            support::eventually(Duration::from_secs(10), "the waiter's place", || {
                queue_on(from, name).len() == i + 1
            });
            waiter
        })
        .collect();
    let before = queue_on(from, name);

    migration.begin();
    let released = Instant::now();
    held.unlock().unwrap();
    let release_took = released.elapsed();
    // The waiters meet the migration for a while.
    thread::sleep(Duration::from_millis(500));
    migration.move_keys();
    migration.finish();
    let moved_queue = queue_on(migration.to, name);
    let order: Vec<usize> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
        .collect();
    let served_after = released.elapsed();
    for waiter in waiters {
        waiter.joined();
    }
    println!(
        "release took {release_took:?}; both served {served_after:?} after it; \
         queue before {before:?}, on the new master {moved_queue:?}"
    );
    assert!(
        release_took < Duration::from_secs(2),
        "the release waited out the migration: {release_took:?}"
    );
    assert_eq!(order, vec![0, 1]);
    // Whoever was still waiting when the keys moved kept its arrival.
    for (waiter, arrival) in &moved_queue {
        assert!(
            before.contains(&(waiter.clone(), *arrival)),
            "{waiter} lost its place: {moved_queue:?} vs {before:?}"
        );
    }
    assert!(served_after < Duration::from_secs(10), "{served_after:?}");
}

/// The release of a waiter that went first names the next waiter's own
/// list (its acquisition found that waiter next in line, see
/// `fair/release.lua`). While the slot migrates, that list (empty: no
/// key) beside keys the node has makes Redis refuse the script with
/// `TRYAGAIN`: the release is sent again without it, succeeds at once, and
/// the next waiter is served once the keys have moved.
#[test]
fn a_release_naming_the_next_waiters_list_rides_out_a_slot_migration() {
    let deployment = Deployment::start(Topology::Cluster);
    let name = "moving-next";
    let migration = SlotMigration::of(deployment.cluster(), &queue_key(name));
    let holder = client(&deployment);
    let held = holder.fair_lock(name).unwrap().lock().unwrap();
    let (served, order) = mpsc::channel();
    let (go, first_may_go) = mpsc::channel::<()>();
    let (unlocked, first_unlocked) = mpsc::channel();
    let mut first = Some((first_may_go, unlocked));
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let client = client(&deployment);
            let served = served.clone();
            let first = first.take();
            let waiter = thread::spawn(move || {
                let guard = client
                    .fair_lock(name)
                    .unwrap()
                    .try_lock_for(Duration::from_secs(30))
                    .unwrap()
                    .expect("served");
                served.send(i).unwrap();
                match first {
                    Some((may_go, unlocked)) => {
                        may_go.recv().unwrap();
                        let started = Instant::now();
                        let result = guard.unlock().map_err(|err| err.to_string());
                        unlocked.send((result, started.elapsed())).unwrap();
                    }
                    None => guard.unlock().unwrap(),
                }
            });
            support::eventually(Duration::from_secs(10), "the waiter's place", || {
                queue_on(migration.from, name).len() == i + 1
            });
            waiter
        })
        .collect();
    held.unlock().unwrap();
    assert_eq!(order.recv_timeout(Duration::from_secs(20)), Ok(0));

    migration.begin();
    go.send(()).unwrap();
    let (result, took) = first_unlocked
        .recv_timeout(Duration::from_secs(20))
        .unwrap();
    assert_eq!(result, Ok(()), "the first waiter's release");
    assert!(
        took < Duration::from_secs(2),
        "the release waited out the migration: {took:?}"
    );
    migration.move_keys();
    migration.finish();
    assert_eq!(order.recv_timeout(Duration::from_secs(20)), Ok(1));
    for waiter in waiters {
        waiter.joined();
    }
}

/// A release that hands the lock to a parked thread of its own client
/// (`fair/handoff.lua`, under a fixed lease) while the slot migrates, one
/// of that script's keys (the fencing counter) already moved: Redis
/// refuses the hand-off with `TRYAGAIN` before it runs, and the lock is
/// released as usual instead (a release rides out a migration, see above),
/// at once. The waiter is served once the keys have moved.
#[test]
fn a_hand_off_refused_while_the_slot_migrates_becomes_a_release() {
    hand_off_while_the_slot_migrates("moving-handoff", Some(Duration::from_secs(30)));
}

/// The same under a renewed lease: the holder passes the lock in memory,
/// and the waiter's release, the last of the run, drops the place it was
/// served for while the slot migrates, reading no key after a write (see
/// `head_after_drops`): its release is not refused half done.
#[test]
fn a_runs_last_release_while_the_slot_migrates_drops_the_places_served() {
    hand_off_while_the_slot_migrates("moving-run", None);
}

/// A holder and a waiter of one client, the holder's acquisition finding
/// the waiter next in line; the holder releases while the slot migrates,
/// the fencing counter already moved.
fn hand_off_while_the_slot_migrates(name: &'static str, fixed_lease: Option<Duration>) {
    let deployment = Deployment::start(Topology::Cluster);
    let migration = SlotMigration::of(deployment.cluster(), &queue_key(name));
    let (first, here) = (client(&deployment), client(&deployment));
    let blocker = first.fair_lock(name).unwrap().lock().unwrap();
    let (served, order) = mpsc::channel();
    let (go, holder_may_go) = mpsc::channel::<()>();
    let (unlocked, holder_unlocked) = mpsc::channel();
    let mut holder = Some((holder_may_go, unlocked));
    // The holder, then the waiter, both of `here`: the holder's
    // acquisition finds the waiter next in line.
    let threads: Vec<_> = ["holder", "waiter"]
        .into_iter()
        .enumerate()
        .map(|(i, who)| {
            let lock = here.fair_lock(name).unwrap();
            let lock = match fixed_lease {
                Some(lease) => lock.with_fixed_lease(lease).unwrap(),
                None => lock,
            };
            let served = served.clone();
            let holder = holder.take();
            let thread = thread::spawn(move || {
                let guard = lock
                    .try_lock_for(Duration::from_secs(30))
                    .unwrap()
                    .expect("served");
                served.send(who).unwrap();
                match holder {
                    Some((may_go, unlocked)) => {
                        may_go.recv().unwrap();
                        let started = Instant::now();
                        let result = guard.unlock().map_err(|err| err.to_string());
                        unlocked.send((result, started.elapsed())).unwrap();
                    }
                    None => guard.unlock().unwrap(),
                }
            });
            support::eventually(Duration::from_secs(10), "the waiter's place", || {
                queue_on(migration.from, name).len() == i + 1
            });
            thread
        })
        .collect();
    blocker.unlock().unwrap();
    assert_eq!(order.recv_timeout(Duration::from_secs(20)), Ok("holder"));

    migration.begin();
    let fence_key = format!("redbaton:{{{name}}}:fair:fence");
    redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(migration.to.port())
        .arg(&fence_key)
        .arg(0)
        .arg(5_000)
        .query::<()>(&mut migration.from.connection())
        .unwrap();
    go.send(()).unwrap();
    let (result, took) = holder_unlocked
        .recv_timeout(Duration::from_secs(20))
        .unwrap();
    assert_eq!(result, Ok(()), "the holder's release");
    assert!(
        took < Duration::from_secs(2),
        "the release waited out the migration: {took:?}"
    );
    migration.move_keys();
    migration.finish();
    assert_eq!(order.recv_timeout(Duration::from_secs(20)), Ok("waiter"));
    for thread in threads {
        thread.joined();
    }
}

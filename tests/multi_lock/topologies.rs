//! The multi-lock on a cluster (names across slots, and names that share
//! one), on Sentinel, and on a Redlock quorum (one round for the set).

#[allow(unused_imports)]
use std::time::Duration;

#[allow(unused_imports)]
use crate::support::{Deployment, Topology};

/// On a cluster, a set whose names span slots is all or none too: a name
/// held in a later slot undoes the earlier slots' names.
#[cfg(feature = "cluster")]
#[test]
fn a_cluster_set_across_slots_is_all_or_none() {
    let deployment = Deployment::start(Topology::Cluster);
    let (holder, other) = (deployment.client(), deployment.client());
    let names: Vec<String> = (0..6).map(|i| format!("cl-{i}")).collect();
    let set = other.multi_lock(&names).unwrap();
    let free = |name: &str| {
        let key = crate::support::lock_key(name);
        redis::cmd("EXISTS")
            .arg(&key)
            .query::<i64>(&mut deployment.server_for(&key).connection())
            .unwrap()
            == 0
    };
    // Hold each name in turn: the attempt fails and leaves the others free.
    for held_name in &names {
        let held = holder.lock(held_name).unwrap().lock().unwrap();
        assert!(set.try_lock().unwrap().is_none());
        for name in names.iter().filter(|n| *n != held_name) {
            assert!(
                free(name),
                "{name} held after a failed attempt ({held_name} held)"
            );
        }
        held.unlock().unwrap();
    }
    let guard = set.lock().unwrap();
    assert_eq!(guard.fencing_tokens().count(), 6);
    assert!(names.iter().all(|n| !free(n)));
    // A waiter parks and wins when the name in its way is released.
    let held = holder.lock("cl-3").unwrap();
    drop(guard);
    let held = held.lock().unwrap();
    let waiter =
        std::thread::spawn(move || set.try_lock_for(Duration::from_secs(20)).unwrap().is_some());
    let parked_at = deployment.server_for(&crate::support::lock_key("cl-3"));
    crate::support::eventually(Duration::from_secs(5), "the waiter parks", || {
        crate::support::parked(parked_at) == 1
    });
    held.unlock().unwrap();
    assert!(crate::support::JoinWithin::joined(waiter));
}

/// Two names that share a cluster slot go in one script.
#[cfg(feature = "cluster")]
#[test]
fn cluster_names_of_one_slot_are_taken_in_one_script() {
    let deployment = Deployment::start(Topology::Cluster);
    let client = deployment.client();
    // Two names whose lock keys share a slot (each name is its own hash
    // tag, so they meet by the CRC only): found with CLUSTER KEYSLOT.
    let server = deployment.server_for(&crate::support::lock_key("slot-0"));
    let mut con = server.connection();
    let mut slot = |name: &str| -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(crate::support::lock_key(name))
            .query(&mut con)
            .unwrap()
    };
    let mut seen = std::collections::HashMap::new();
    let pair = (0..100_000)
        .map(|i| format!("slot-{i}"))
        .find_map(|name| {
            let s = slot(&name);
            seen.insert(s, name.clone()).map(|first| (first, name))
        })
        .expect("two names in one slot");
    let set = client.multi_lock([&pair.0, &pair.1]).unwrap();
    let guard = set.lock().unwrap();
    assert_eq!(guard.fencing_tokens().count(), 2);
    let other = deployment.client();
    assert!(other.lock(&pair.1).unwrap().try_lock().unwrap().is_none());
    guard.unlock().unwrap();
    assert!(other.lock(&pair.0).unwrap().try_lock().unwrap().is_some());
}

#[cfg(feature = "sentinel")]
#[test]
fn a_sentinel_set_is_all_or_none() {
    let deployment = Deployment::start(Topology::Sentinel);
    let (holder, other) = (deployment.client(), deployment.client());
    let held = holder.lock("sn-b").unwrap().lock().unwrap();
    let set = other.multi_lock(["sn-a", "sn-b"]).unwrap();
    assert!(set.try_lock().unwrap().is_none());
    assert!(other.lock("sn-a").unwrap().holder().unwrap().is_none());
    held.unlock().unwrap();
    let guard = set.try_lock().unwrap().expect("both free");
    assert!(holder.lock("sn-a").unwrap().try_lock().unwrap().is_none());
    guard.unlock().unwrap();
}

/// On a Redlock quorum, the set is taken by one round (one script per
/// master over every name): a name held leaves nothing of the others on
/// any master; each name has the quorum's token; a waiter parks and wins.
#[cfg(feature = "redlock")]
#[test]
fn a_quorum_set_is_all_or_none_on_every_master() {
    let deployment = Deployment::start(Topology::Masters);
    let (holder, other) = (deployment.client(), deployment.client());
    let names = ["q-a", "q-b", "q-c"];
    let set = other.multi_lock(names).unwrap();
    let on_any_master = |name: &str| {
        let key = crate::support::lock_key(name);
        deployment.servers_for(&key).iter().any(|server| {
            redis::cmd("EXISTS")
                .arg(&key)
                .query::<i64>(&mut server.connection())
                .unwrap()
                == 1
        })
    };
    for held_name in names {
        let held = holder.lock(held_name).unwrap().lock().unwrap();
        assert!(set.try_lock().unwrap().is_none());
        for name in names.iter().filter(|n| **n != held_name) {
            assert!(
                !on_any_master(name),
                "{name} left on a master ({held_name} held)"
            );
        }
        held.unlock().unwrap();
    }
    let guard = set.lock().unwrap();
    for name in names {
        let seen = holder.lock(name).unwrap().holder().unwrap().unwrap();
        assert_eq!(Some(seen.fencing_token), guard.fencing_token(name));
    }
    drop(guard);
    assert!(names.iter().all(|name| !on_any_master(name)));

    let held = holder.lock("q-c").unwrap().lock().unwrap();
    let waiter =
        std::thread::spawn(move || set.try_lock_for(Duration::from_secs(20)).unwrap().is_some());
    crate::support::eventually(Duration::from_secs(5), "the waiter parks", || {
        deployment
            .servers_for(&crate::support::lock_key("q-c"))
            .iter()
            .any(|server| crate::support::parked(server) == 1)
    });
    held.unlock().unwrap();
    assert!(crate::support::JoinWithin::joined(waiter));
}

/// The commands a quorum master ran since `before`, and how many of them
/// were script calls (`EVALSHA` or `EVAL`).
#[cfg(feature = "redlock")]
fn script_calls(
    master: &testkit::RedisServer,
    before: &std::collections::BTreeMap<String, u64>,
) -> (u64, std::collections::BTreeMap<String, u64>) {
    let ran = master.commands_since(before);
    let scripts = ["evalsha", "eval"]
        .iter()
        .filter_map(|command| ran.get(*command))
        .sum();
    (scripts, ran)
}

/// The commands a lock script runs inside the server: `INFO commandstats`
/// counts them too, but they cost no round trip.
#[cfg(feature = "redlock")]
const RUN_BY_SCRIPTS: &[&str] = &[
    "evalsha", "eval", "hmget", "hget", "get", "time", "set", "hset", "hdel", "pexpire", "pttl",
    "del", "exists", "rpush", "lpush", "ltrim", "llen", "lrange",
];

/// An uncontended set of three names on a quorum costs each master exactly
/// one script call to take (`lock/acquire_many.lua`), and nothing else
/// the client sends (no `SCRIPT LOAD`, no second round: the masters agree
/// on the proposed tokens), as one lock's acquisition costs one script
/// call per master; and one script call to release.
#[cfg(feature = "redlock")]
#[test]
fn an_uncontended_quorum_set_is_taken_with_one_script_per_master() {
    let deployment = Deployment::start(Topology::Masters);
    let client = deployment.client();
    let names = ["one-a", "one-b", "one-c"];
    let set = client.multi_lock(names).unwrap();
    // Scripts loaded, connections open, this thread's identity made.
    set.lock().unwrap().unlock().unwrap();
    let masters = deployment.servers_for(&crate::support::lock_key("one-a"));
    assert_eq!(masters.len(), 3);
    let before: Vec<_> = masters.iter().map(|m| m.command_calls()).collect();
    let guard = set.lock().unwrap();
    for (index, (master, before)) in masters.iter().zip(&before).enumerate() {
        let (scripts, ran) = script_calls(master, before);
        println!("master {index} ran, to take the set: {ran:?}");
        assert_eq!(scripts, 1, "master {index}: {ran:?}");
        for command in ran.keys() {
            assert!(
                RUN_BY_SCRIPTS.contains(&command.as_str()),
                "master {index} was sent {command}: {ran:?}"
            );
        }
    }
    // One token per name, the one every master stores for it.
    for name in names {
        let seen = client.lock(name).unwrap().holder().unwrap().unwrap();
        assert_eq!(Some(seen.fencing_token), guard.fencing_token(name));
    }
    // And one to release (`lock/release_many.lua`: each name's release).
    let before: Vec<_> = masters.iter().map(|m| m.command_calls()).collect();
    guard.unlock().unwrap();
    for (index, (master, before)) in masters.iter().zip(&before).enumerate() {
        let (scripts, ran) = script_calls(master, before);
        println!("master {index} ran, to release the set: {ran:?}");
        assert_eq!(scripts, 1, "master {index}: {ran:?}");
        for command in ran.keys() {
            assert!(
                RUN_BY_SCRIPTS.contains(&command.as_str()),
                "master {index} was sent {command}: {ran:?}"
            );
        }
        for name in names {
            assert!(
                !crate::exists(master, name),
                "{name} left on master {index}"
            );
        }
    }
}

/// A set's release on a quorum is one call per master, but each name's
/// release stands on its own there: a name whose baton key holds
/// something else is refused (the error reported, the name left as it
/// was), and the other names are released.
#[cfg(feature = "redlock")]
#[test]
fn a_quorum_sets_release_reports_a_refused_name_and_frees_the_others() {
    let deployment = Deployment::start(Topology::Masters);
    let (client, other) = (deployment.client(), deployment.client());
    let masters = deployment.servers_for(&crate::support::lock_key("rel-a"));
    let set = client.multi_lock(["rel-a", "rel-b"]).unwrap();
    let guard = set.lock().unwrap();
    // Someone found `rel-b` held (its release must push a baton), and its
    // baton key holds a string on every master.
    assert!(other.lock("rel-b").unwrap().try_lock().unwrap().is_none());
    for master in &masters {
        let _: () = redis::cmd("SET")
            .arg(crate::support::baton_key("rel-b"))
            .arg("not a list")
            .query(&mut master.connection())
            .unwrap();
    }
    let err = guard.unlock().unwrap_err();
    // As one lock's release tells it.
    assert!(
        matches!(&err, redbaton::Error::WrongType { name, .. } if name == "rel-b"),
        "{err:?}"
    );
    for (index, master) in masters.iter().enumerate() {
        assert!(
            !crate::exists(master, "rel-a"),
            "rel-a left on master {index}"
        );
        assert!(
            crate::exists(master, "rel-b"),
            "rel-b released on master {index}"
        );
    }
}

/// One master's fencing counter for one name is far ahead: the masters
/// issue different tokens for that name, which alone gets a second round
/// (the other names agree on the proposal in the first). The set is taken
/// with each name's token at least every master's counter for it, and
/// every master stores that token.
#[cfg(feature = "redlock")]
#[test]
fn a_quorum_set_whose_tokens_disagree_on_one_name_agrees_on_that_one() {
    let deployment = Deployment::start(Topology::Masters);
    let client = deployment.client();
    let masters = deployment.servers_for(&crate::support::lock_key("dis-a"));
    let fence_key = |name: &str| format!("redbaton:{{{}}}:fence", crate::support::hash_tag(name));
    let counter = |master: &testkit::RedisServer, name: &str| -> u64 {
        redis::cmd("GET")
            .arg(fence_key(name))
            .query::<Option<u64>>(&mut master.connection())
            .unwrap()
            .unwrap_or(0)
    };
    // Far above any token a clock issues (about 1.8 × 10^15 in 2026).
    const HIGH: u64 = 5_000_000_000_000_000;
    // Warm-up: the set's script and the second round's loaded everywhere
    // (a lock whose counter is ahead on one master gets a second round).
    let _: () = redis::cmd("SET")
        .arg(fence_key("dis-warm"))
        .arg(HIGH)
        .query(&mut masters[0].connection())
        .unwrap();
    client
        .lock("dis-warm")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    let set = client.multi_lock(["dis-a", "dis-b", "dis-c"]).unwrap();
    set.lock().unwrap().unlock().unwrap();

    let _: () = redis::cmd("SET")
        .arg(fence_key("dis-b"))
        .arg(HIGH)
        .query(&mut masters[0].connection())
        .unwrap();
    let before: Vec<_> = masters.iter().map(|m| m.command_calls()).collect();
    let guard = set.lock().unwrap();
    for (index, (master, before)) in masters.iter().zip(&before).enumerate() {
        let (scripts, ran) = script_calls(master, before);
        println!("master {index} ran: {ran:?}");
        // The set's script, and the second round for `dis-b` only.
        assert_eq!(scripts, 2, "master {index}: {ran:?}");
    }
    let token_b = guard.fencing_token("dis-b").unwrap();
    assert!(
        token_b > HIGH,
        "dis-b's token {token_b} is not above the counter"
    );
    for name in ["dis-a", "dis-b", "dis-c"] {
        let token = guard.fencing_token(name).unwrap();
        for (index, master) in masters.iter().enumerate() {
            let counter = counter(master, name);
            assert!(
                token >= counter,
                "{name}: token {token} below master {index}'s counter {counter}"
            );
        }
        let seen = client.lock(name).unwrap().holder().unwrap().unwrap();
        assert_eq!(seen.fencing_token, token, "{name}");
    }
    assert!(guard.fencing_token("dis-a").unwrap() < HIGH);
    guard.unlock().unwrap();
    for name in ["dis-a", "dis-b", "dis-c"] {
        assert!(
            masters.iter().all(|master| !crate::exists(master, name)),
            "{name} left on a master after the release"
        );
    }
}

/// A set whose one name is held on a majority only (its copy on the first
/// master gone) takes nothing on any master, though the first master
/// grants the whole set: that grant is undone. The waiter parks on a
/// master that holds the name in its way (the first has no copy, so no
/// release would wake it there) and wins when it is released.
#[cfg(feature = "redlock")]
#[test]
fn a_quorum_set_with_a_name_held_on_a_majority_takes_nothing_anywhere() {
    let deployment = Deployment::start(Topology::Masters);
    let (holder, other) = (deployment.client(), deployment.client());
    let masters = deployment.servers_for(&crate::support::lock_key("maj-b"));
    let held = holder.lock("maj-b").unwrap().lock().unwrap();
    let token = held.fencing_token();
    let _: i64 = redis::cmd("DEL")
        .arg(crate::support::lock_key("maj-b"))
        .query(&mut masters[0].connection())
        .unwrap();
    let set = other
        .multi_lock(["maj-a", "maj-b", "maj-c"])
        .unwrap()
        // Holding nothing while it waits (no partial set).
        .hold_back_after(Duration::MAX);
    assert!(set.try_lock().unwrap().is_none());
    for name in ["maj-a", "maj-c"] {
        for (index, master) in masters.iter().enumerate() {
            assert!(
                !crate::exists(master, name),
                "{name} left on master {index}"
            );
        }
    }
    assert!(
        !crate::exists(masters[0], "maj-b"),
        "maj-b left on master 0"
    );
    let seen = holder.lock("maj-b").unwrap().holder().unwrap().unwrap();
    assert_eq!(seen.fencing_token, token, "the holder keeps maj-b");

    let waiter =
        std::thread::spawn(move || set.try_lock_for(Duration::from_secs(20)).unwrap().is_some());
    crate::support::eventually(Duration::from_secs(5), "the waiter parks", || {
        masters[1..]
            .iter()
            .any(|master| crate::support::parked(master) == 1)
    });
    assert_eq!(
        crate::support::parked(masters[0]),
        0,
        "parked where no baton comes"
    );
    let released = std::time::Instant::now();
    held.unlock().unwrap();
    assert!(crate::support::JoinWithin::joined(waiter));
    // Woken by the release's baton, not at the end of a park.
    let took = released.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// Under `replica_acks`, a set is granted only once a replica has every
/// name; when none can confirm, every name the script took is undone.
#[cfg(feature = "sentinel")]
#[test]
fn with_replica_acks_a_set_is_confirmed_or_undone_whole() {
    use crate::support::{cut_replica, restore_replica};
    let deployment = Deployment::start(Topology::Sentinel);
    let sentinels = deployment.sentinels();
    let client = deployment
        .builder()
        .replica_acks(1, Duration::from_millis(500))
        .build()
        .unwrap();
    let set = client.multi_lock(["ra-a", "ra-b"]).unwrap();
    let locked = |name: &str| client.lock(name).unwrap().is_locked().unwrap();

    cut_replica(sentinels);
    let err = set.try_lock().unwrap_err();
    assert!(
        matches!(
            err,
            redbaton::Error::NotReplicated {
                wanted: 1,
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        !locked("ra-a") && !locked("ra-b"),
        "the unconfirmed set was undone"
    );

    restore_replica(sentinels);
    let guard = set
        .try_lock_for(Duration::from_secs(5))
        .unwrap()
        .expect("both free");
    let replica = &sentinels.replicas()[0];
    for name in ["ra-a", "ra-b"] {
        let on_replica: i64 = redis::cmd("EXISTS")
            .arg(crate::support::lock_key(name))
            .query(&mut replica.connection())
            .unwrap();
        assert_eq!(on_replica, 1, "{name} granted before the replica had it");
    }
    guard.unlock().unwrap();
    assert!(!locked("ra-a") && !locked("ra-b"));
}

/// Overlapping sets from threads of two clients: exclusion per name (a
/// marker on a separate server) and everyone done in time.
#[allow(dead_code)]
fn overlapping_sets_exclude_and_all_finish(deployment: &Deployment) {
    use crate::support::JoinWithin;
    let markers = testkit::RedisServer::start();
    let clients = [deployment.client(), deployment.client()];
    let sets = [["ov-a", "ov-b"], ["ov-b", "ov-c"], ["ov-a", "ov-c"]];
    let start = std::time::Instant::now();
    let overlaps: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6usize)
            .map(|i| {
                let (client, names, markers) = (&clients[i % 2], sets[i % 3], &markers);
                scope.spawn(move || {
                    let set = client.multi_lock(names).unwrap();
                    let mut con = markers.connection();
                    let mut overlaps = 0;
                    for _ in 0..15 {
                        let guard = set
                            .try_lock_for(Duration::from_secs(30))
                            .unwrap()
                            .expect("a set waited 30 s");
                        for name in names {
                            let inside: i64 = redis::cmd("INCR").arg(name).query(&mut con).unwrap();
                            overlaps += u64::from(inside != 1);
                        }
                        for name in names {
                            let _: i64 = redis::cmd("DECR").arg(name).query(&mut con).unwrap();
                        }
                        drop(guard);
                    }
                    overlaps
                })
            })
            .collect();
        handles.into_iter().map(JoinWithin::joined).sum()
    });
    assert_eq!(overlaps, 0, "two holders of one name at once");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

#[cfg(feature = "redlock")]
#[test]
fn overlapping_quorum_sets_exclude_and_all_finish() {
    overlapping_sets_exclude_and_all_finish(&Deployment::start(Topology::Masters));
}

#[cfg(feature = "cluster")]
#[test]
fn overlapping_cluster_sets_across_slots_exclude_and_all_finish() {
    overlapping_sets_exclude_and_all_finish(&Deployment::start(Topology::Cluster));
}

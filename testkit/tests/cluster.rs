//! The throwaway Redis Cluster forms, covers every slot, and redirects a
//! key to its master.

use testkit::{RedisCluster, SLOTS};

#[test]
fn a_cluster_of_three_masters_with_replicas_covers_every_slot_and_redirects() {
    let cluster = RedisCluster::start(3, 1);
    assert_eq!(cluster.masters().len(), 3);
    assert_eq!(cluster.nodes().count(), 6);

    let mut raw = cluster.masters()[0].connection();
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut raw).unwrap();
    assert!(
        info.contains(&format!("cluster_slots_assigned:{SLOTS}")),
        "{info}"
    );
    assert!(info.contains("cluster_known_nodes:6"), "{info}");

    // A key whose slot another master owns is redirected there.
    let key = (0..)
        .map(|n| format!("key:{n}"))
        .find(|key| {
            !std::ptr::eq(
                cluster.master_of_slot(cluster.slot_of(key)),
                &cluster.masters()[0],
            )
        })
        .unwrap();
    let owner = cluster.master_of_slot(cluster.slot_of(&key));
    let err = redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query::<()>(&mut raw)
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!(":{}", owner.port())),
        "MOVED to the owner: {err}"
    );
    redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query::<()>(&mut owner.connection())
        .unwrap();
}

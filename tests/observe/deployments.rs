//! The events a deployment causes: a cluster's slot map loaded, a sentinel's
//! new master, a Redlock master left out and back.

#[cfg(any(feature = "sentinel", feature = "redlock"))]
use std::time::Duration;

#[cfg(any(feature = "sentinel", feature = "redlock"))]
use crate::support::eventually;
use crate::support::{Deployment, Topology};

use crate::events::Recorder;

#[cfg(feature = "cluster")]
#[test]
fn a_cluster_client_tells_its_slot_map_load() {
    let deployment = Deployment::start(Topology::Cluster);
    let recorder = Recorder::default();
    let client = deployment
        .builder()
        .on_event(recorder.hook())
        .build()
        .unwrap();
    client
        .lock("mapped")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    client
        .lock("mapped")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    let loads = recorder
        .whats()
        .iter()
        .filter(|w| *w == "SlotMapReloaded")
        .count();
    assert_eq!(
        loads,
        1,
        "one load, at the first call: {:?}",
        recorder.whats()
    );
}

#[cfg(feature = "sentinel")]
#[test]
fn a_sentinel_failover_is_told_as_a_master_switch() {
    let deployment = Deployment::start(Topology::Sentinel);
    let sentinels = deployment.sentinels();
    let recorder = Recorder::default();
    let client = deployment
        .builder()
        .on_event(recorder.hook())
        .build()
        .unwrap();
    // The first call looks the master up and starts following events.
    client
        .lock("switched")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    crate::support::wait_for_replica(sentinels.master(), "test-sync");
    let old = sentinels.master().port();
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(crate::support::SERVICE)
        .query::<()>(&mut sentinels.sentinels()[0].connection())
        .unwrap();
    eventually(Duration::from_secs(30), "the switch is told", || {
        recorder
            .whats()
            .iter()
            .any(|w| w.starts_with("MasterSwitched"))
    });
    assert_ne!(sentinels.current_master_port(), Some(old));
    let switched = format!(
        "MasterSwitched {{ service: {:?} }}",
        crate::support::SERVICE
    );
    assert!(
        recorder.whats().contains(&switched),
        "{:?}",
        recorder.whats()
    );
}

#[cfg(feature = "redlock")]
#[test]
fn a_redlock_master_that_stops_answering_is_told_suspect_then_back() {
    let deployment = Deployment::start(Topology::Masters);
    let recorder = Recorder::default();
    let client = deployment
        .builder()
        .node_timeout(Duration::from_millis(200))
        .on_event(recorder.hook())
        .build()
        .unwrap();
    let masters = deployment.servers_for(&crate::support::lock_key("quorum"));
    let down = masters[0];
    down.kill();
    let lock = client.lock("quorum").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    let is = |what: &str| {
        let what = what.to_owned();
        let port = format!(":{}", down.port());
        move |w: &String| w.starts_with(&what) && w.contains(&port)
    };
    let whats = recorder.whats();
    assert_eq!(
        whats.iter().filter(|w| is("MasterSuspect")(w)).count(),
        1,
        "{whats:?}"
    );
    assert!(!whats.iter().any(is("MasterBack")), "{whats:?}");
    down.restart();
    eventually(Duration::from_secs(20), "the master is told back", || {
        recorder.whats().iter().any(is("MasterBack"))
    });
}

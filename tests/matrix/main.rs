//! The fault matrix: every synchronizer × every deployment it is offered
//! on × every event that deployment can have, each cell a test of its own
//! run by one driver (`cell.rs`) with small per-synchronizer adapters
//! (`subject.rs`) and the events in `events.rs`. A cell that does not
//! apply is listed with its reason by `every_cell_is_run_or_skipped`.
//!
//! Adding a synchronizer is an arm in `subject.rs` (and `spec.rs`); adding
//! an event is a variant in `events.rs` and rows in the table below.

#[path = "../support/mod.rs"]
mod support;

mod cell;
mod checks;
mod events;
mod latch;
mod spec;
mod subject;
mod worker;

use events::Event;
use spec::{Deploy, Sync};

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
#[ignore = "child-process entry point, started by the tests of this binary"]
fn child_entry() {
    support::run_child_role(&[worker::run_child, latch::run_child]);
}

/// The table: `test_name: Synchronizer, Deployment, Event;`, each row a
/// `#[test]` (attributes such as `#[ignore = "..."]` go before the name),
/// and all of them in `CELLS`.
macro_rules! matrix {
    ($($(#[$meta:meta])* $test:ident: $sync:ident, $deploy:ident, $event:expr;)*) => {
        $(
            $(#[$meta])*
            #[test]
            fn $test() {
                cell::run(Sync::$sync, Deploy::$deploy, $event);
            }
        )*

        /// Every row of the table.
        const CELLS: &[(Sync, Deploy, Event)] = &[$((Sync::$sync, Deploy::$deploy, $event)),*];
    };
}

matrix! {
    // One server.
    lock_single_holder_killed: Lock, Single, Event::HolderKilled;
    lock_single_waiter_killed: Lock, Single, Event::WaiterKilled;
    lock_single_holder_stopped: Lock, Single, Event::HolderStopped;
    lock_single_lost_reply: Lock, Single, Event::LostReply;
    lock_single_busy: Lock, Single, Event::Busy;
    lock_single_max_park_1ms: Lock, Single, Event::MaxPark(1);
    lock_single_max_park_20ms: Lock, Single, Event::MaxPark(20);
    lock_single_max_park_100ms: Lock, Single, Event::MaxPark(100);
    fair_single_holder_killed: Fair, Single, Event::HolderKilled;
    fair_single_waiter_killed: Fair, Single, Event::WaiterKilled;
    fair_single_holder_stopped: Fair, Single, Event::HolderStopped;
    fair_single_lost_reply: Fair, Single, Event::LostReply;
    fair_single_busy: Fair, Single, Event::Busy;
    fair_single_max_park_1ms: Fair, Single, Event::MaxPark(1);
    fair_single_max_park_20ms: Fair, Single, Event::MaxPark(20);
    fair_single_max_park_100ms: Fair, Single, Event::MaxPark(100);
    rw_single_holder_killed: RwLock, Single, Event::HolderKilled;
    rw_single_waiter_killed: RwLock, Single, Event::WaiterKilled;
    rw_single_holder_stopped: RwLock, Single, Event::HolderStopped;
    rw_single_lost_reply: RwLock, Single, Event::LostReply;
    rw_single_busy: RwLock, Single, Event::Busy;
    rw_single_max_park_1ms: RwLock, Single, Event::MaxPark(1);
    rw_single_max_park_20ms: RwLock, Single, Event::MaxPark(20);
    rw_single_max_park_100ms: RwLock, Single, Event::MaxPark(100);
    sem_single_holder_killed: Semaphore, Single, Event::HolderKilled;
    sem_single_waiter_killed: Semaphore, Single, Event::WaiterKilled;
    sem_single_holder_stopped: Semaphore, Single, Event::HolderStopped;
    sem_single_lost_reply: Semaphore, Single, Event::LostReply;
    sem_single_busy: Semaphore, Single, Event::Busy;
    sem_single_max_park_1ms: Semaphore, Single, Event::MaxPark(1);
    sem_single_max_park_20ms: Semaphore, Single, Event::MaxPark(20);
    sem_single_max_park_100ms: Semaphore, Single, Event::MaxPark(100);
    sem_single_adjust: Semaphore, Single, Event::Adjust;
    latch_single_waiter_killed: Latch, Single, Event::WaiterKilled;
    latch_single_lost_reply: Latch, Single, Event::LostReply;
    latch_single_busy: Latch, Single, Event::Busy;
    latch_single_max_park_1ms: Latch, Single, Event::MaxPark(1);
    latch_single_max_park_20ms: Latch, Single, Event::MaxPark(20);
    latch_single_max_park_100ms: Latch, Single, Event::MaxPark(100);
    latch_single_rearm: Latch, Single, Event::Rearm;
    rate_single_lost_reply: Rate, Single, Event::LostReply;
    rate_single_busy: Rate, Single, Event::Busy;
    multi_single_holder_killed: Multi, Single, Event::HolderKilled;
    multi_single_waiter_killed: Multi, Single, Event::WaiterKilled;
    multi_single_holder_stopped: Multi, Single, Event::HolderStopped;
    multi_single_lost_reply: Multi, Single, Event::LostReply;
    multi_single_busy: Multi, Single, Event::Busy;
    multi_single_max_park_1ms: Multi, Single, Event::MaxPark(1);
    multi_single_max_park_20ms: Multi, Single, Event::MaxPark(20);
    multi_single_max_park_100ms: Multi, Single, Event::MaxPark(100);

    // A cluster of three masters.
    lock_cluster_holder_killed: Lock, Cluster, Event::HolderKilled;
    lock_cluster_migration: Lock, Cluster, Event::Migration;
    lock_cluster_migration_stalled: Lock, Cluster, Event::MigrationStalled;
    lock_cluster_busy: Lock, Cluster, Event::Busy;
    fair_cluster_holder_killed: Fair, Cluster, Event::HolderKilled;
    fair_cluster_migration: Fair, Cluster, Event::Migration;
    fair_cluster_migration_stalled: Fair, Cluster, Event::MigrationStalled;
    fair_cluster_busy: Fair, Cluster, Event::Busy;
    rw_cluster_holder_killed: RwLock, Cluster, Event::HolderKilled;
    rw_cluster_migration: RwLock, Cluster, Event::Migration;
    rw_cluster_migration_stalled: RwLock, Cluster, Event::MigrationStalled;
    rw_cluster_busy: RwLock, Cluster, Event::Busy;
    sem_cluster_holder_killed: Semaphore, Cluster, Event::HolderKilled;
    sem_cluster_migration: Semaphore, Cluster, Event::Migration;
    sem_cluster_migration_stalled: Semaphore, Cluster, Event::MigrationStalled;
    sem_cluster_busy: Semaphore, Cluster, Event::Busy;
    latch_cluster_migration: Latch, Cluster, Event::Migration;
    latch_cluster_migration_stalled: Latch, Cluster, Event::MigrationStalled;
    latch_cluster_busy: Latch, Cluster, Event::Busy;
    latch_cluster_rearm: Latch, Cluster, Event::Rearm;
    rate_cluster_migration: Rate, Cluster, Event::Migration;
    rate_cluster_migration_stalled: Rate, Cluster, Event::MigrationStalled;
    rate_cluster_busy: Rate, Cluster, Event::Busy;
    // The set's two names have their own hash tags (most likely two
    // slots); the migration and the busy script are `m`'s slot's.
    multi_cluster_holder_killed: Multi, Cluster, Event::HolderKilled;
    multi_cluster_migration: Multi, Cluster, Event::Migration;
    multi_cluster_migration_stalled: Multi, Cluster, Event::MigrationStalled;
    multi_cluster_busy: Multi, Cluster, Event::Busy;

    // A master, two replicas and three sentinels, replica_acks(1, 300 ms).
    lock_sentinel_failover: Lock, Sentinel, Event::Failover;
    lock_sentinel_master_killed: Lock, Sentinel, Event::MasterKilled;
    fair_sentinel_failover: Fair, Sentinel, Event::Failover;
    fair_sentinel_master_killed: Fair, Sentinel, Event::MasterKilled;
    rw_sentinel_failover: RwLock, Sentinel, Event::Failover;
    rw_sentinel_master_killed: RwLock, Sentinel, Event::MasterKilled;
    sem_sentinel_failover: Semaphore, Sentinel, Event::Failover;
    sem_sentinel_master_killed: Semaphore, Sentinel, Event::MasterKilled;
    latch_sentinel_failover: Latch, Sentinel, Event::Failover;
    latch_sentinel_master_killed: Latch, Sentinel, Event::MasterKilled;
    latch_sentinel_rearm: Latch, Sentinel, Event::Rearm;
    rate_sentinel_failover: Rate, Sentinel, Event::Failover;
    rate_sentinel_master_killed: Rate, Sentinel, Event::MasterKilled;
    multi_sentinel_failover: Multi, Sentinel, Event::Failover;
    multi_sentinel_master_killed: Multi, Sentinel, Event::MasterKilled;

    // A Redlock quorum of three masters (the plain lock and the
    // multi-lock only).
    lock_masters_holder_killed: Lock, Masters, Event::HolderKilled;
    lock_masters_waiter_killed: Lock, Masters, Event::WaiterKilled;
    lock_masters_holder_stopped: Lock, Masters, Event::HolderStopped;
    lock_masters_lost_reply: Lock, Masters, Event::LostReply;
    lock_masters_master_stopped: Lock, Masters, Event::QuorumMasterStopped;
    lock_masters_master_killed: Lock, Masters, Event::QuorumMasterKilled;
    lock_masters_busy: Lock, Masters, Event::Busy;
    lock_masters_max_park_20ms: Lock, Masters, Event::MaxPark(20);
    multi_masters_holder_killed: Multi, Masters, Event::HolderKilled;
    multi_masters_waiter_killed: Multi, Masters, Event::WaiterKilled;
    multi_masters_holder_stopped: Multi, Masters, Event::HolderStopped;
    multi_masters_lost_reply: Multi, Masters, Event::LostReply;
    multi_masters_master_stopped: Multi, Masters, Event::QuorumMasterStopped;
    multi_masters_master_killed: Multi, Masters, Event::QuorumMasterKilled;
    multi_masters_busy: Multi, Masters, Event::Busy;
    multi_masters_max_park_20ms: Multi, Masters, Event::MaxPark(20);
}

/// Every event, with the `max_park` values the matrix tries.
const EVENTS: &[Event] = &[
    Event::HolderKilled,
    Event::WaiterKilled,
    Event::HolderStopped,
    Event::LostReply,
    Event::Failover,
    Event::MasterKilled,
    Event::Migration,
    Event::MigrationStalled,
    Event::QuorumMasterStopped,
    Event::QuorumMasterKilled,
    Event::Busy,
    Event::MaxPark(1),
    Event::MaxPark(20),
    Event::MaxPark(100),
    Event::Rearm,
    Event::Adjust,
];

/// Every cell of synchronizer × deployment × event is in the table or
/// skipped with a reason; prints the skipped ones.
#[test]
fn every_cell_is_run_or_skipped() {
    let syncs = [
        Sync::Lock,
        Sync::Fair,
        Sync::RwLock,
        Sync::Semaphore,
        Sync::Latch,
        Sync::Rate,
        Sync::Multi,
    ];
    let deploys = [
        Deploy::Single,
        Deploy::Cluster,
        Deploy::Sentinel,
        Deploy::Masters,
    ];
    let (mut run, mut missing) = (0, Vec::new());
    let mut skipped: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for sync in syncs {
        for deploy in deploys {
            for &event in EVENTS {
                let listed = CELLS.contains(&(sync, deploy, event));
                match (listed, event.skipped(sync, deploy)) {
                    (true, None) => run += 1,
                    (true, Some(reason)) => missing.push(format!(
                        "{sync:?}/{deploy:?}/{event:?} is in the table but skipped: {reason}"
                    )),
                    (false, Some(reason)) => skipped
                        .entry(reason)
                        .or_default()
                        .push(format!("{sync:?}/{deploy:?}/{event:?}")),
                    (false, None) => missing.push(format!("{sync:?}/{deploy:?}/{event:?}")),
                }
            }
        }
    }
    for (reason, cells) in &skipped {
        println!(
            "SKIPPED {} cells: {reason}: {}",
            cells.len(),
            cells.join(" ")
        );
    }
    let skipped: usize = skipped.values().map(Vec::len).sum();
    println!("{run} cells in the table, {skipped} skipped");
    assert!(
        missing.is_empty(),
        "cells neither in the table nor skipped with a reason:\n  {}",
        missing.join("\n  ")
    );
}

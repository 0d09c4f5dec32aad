//! The deployment events of the matrix: what each does to the deployment
//! or to a party while the workers run, where it applies, and how much
//! longer than usual it may make the others wait.

use std::thread;
use std::time::{Duration, Instant};

use testkit::{FaultProxy, SlotMigration};

use crate::spec::{Deploy, Spec, Sync};
use crate::subject::Handle;
use crate::support::{self, eventually, spawn_child_at, Deployment, SERVICE};

/// One event of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A holder of everything (the lock, a write hold, every permit) is
    /// SIGKILLed while holding.
    HolderKilled,
    /// A waiter is SIGKILLed while parked behind the test's own hold.
    WaiterKilled,
    /// A holder of everything is SIGSTOPped past its lease, then continued:
    /// it must learn it lost its hold.
    HolderStopped,
    /// Replies to `EVALSHA` are lost after the command ran (a proxy resets
    /// the connection), a dozen times, over a slow link.
    LostReply,
    /// `SENTINEL FAILOVER`: the old master stays up and writable a while.
    Failover,
    /// The sentinels' master is SIGKILLed.
    MasterKilled,
    /// The name's slot migrates to another master (IMPORTING/MIGRATING,
    /// then `MIGRATE`, then `SETSLOT NODE`) while held and waited on.
    Migration,
    /// As `Migration`, with the slot left 1.5 s in MIGRATING/IMPORTING
    /// before any key moves (between two batches of a reshard).
    MigrationStalled,
    /// One of the Redlock quorum's masters is SIGSTOPped for 1.5 s.
    QuorumMasterStopped,
    /// One of the Redlock quorum's masters is SIGKILLed.
    QuorumMasterKilled,
    /// The name's server runs a script for 1.5 s: `BUSY` to everyone.
    Busy,
    /// The workers' `max_park` is this many ms (on a default-hz server).
    MaxPark(u64),
    /// A latch re-armed for the next round right as a round opens.
    Rearm,
    /// A semaphore's total changed by another client while an adjustment's
    /// reply was lost and resent.
    Adjust,
}

/// The base allowance: the longest a waiter may take to follow a release
/// when nothing happened, with slack for a loaded 2-core machine; well
/// below the cells' 3 s `max_park`, so that a lost wake-up fails.
pub const BASE: Duration = Duration::from_millis(1_800);

/// How many replies the `LostReply` event loses, one after another.
const LOST_REPLIES: usize = 12;

/// The pause after each lost reply before the next is armed: longer than
/// a client's way back to a master it gave up on (a probe's rest, then the
/// background re-send's next try), so that replies are lost now and then.
/// Shorter, and a lone re-send to one master of a quorum loses every reply
/// for seconds: that is a partition, which the stopped-master events
/// stage.
const BETWEEN_LOSSES: Duration = Duration::from_millis(300);

/// What an event did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// How much longer than [`BASE`] the synchronizer may stay shut.
    pub allowance: Duration,
    /// Figures of the event itself, for the summary line.
    pub note: String,
    /// A victim to question once the workers stop: the stopped holder,
    /// which must have learned that it lost its hold.
    pub victim: Option<testkit::ChildProcess>,
}

/// Everything an event may act on.
pub struct Stage<'a> {
    pub deployment: &'a Deployment,
    /// The workers' spec.
    pub spec: &'a Spec,
    /// The test's own handle, on the deployment directly.
    pub admin: &'a Handle,
    pub witness: &'a mut redis::Connection,
    pub proxy: Option<&'a FaultProxy>,
}

impl Event {
    /// Why this event is not run for this synchronizer on this deployment,
    /// or `None` when it is.
    pub fn skipped(self, sync: Sync, deploy: Deploy) -> Option<&'static str> {
        let holds = !matches!(sync, Sync::Rate | Sync::Latch);
        match self {
            _ if deploy == Deploy::Masters && !matches!(sync, Sync::Lock | Sync::Multi) => {
                Some("a Redlock quorum offers only the plain lock and the multi-lock (WrongTopology)")
            }
            Event::HolderKilled | Event::HolderStopped if !holds => {
                Some("nothing is held: no holder to kill or stop")
            }
            Event::WaiterKilled if sync == Sync::Rate => {
                Some("a rate limiter's waiter sleeps locally: nothing on Redis to leave behind")
            }
            Event::LostReply | Event::Adjust
                if matches!(deploy, Deploy::Cluster | Deploy::Sentinel) =>
            {
                Some("the client learns the real node addresses (slot map, sentinels): a proxy in front of one is bypassed")
            }
            Event::Failover | Event::MasterKilled if deploy != Deploy::Sentinel => {
                Some("only Sentinel fails over")
            }
            Event::Migration | Event::MigrationStalled if deploy != Deploy::Cluster => {
                Some("only a cluster migrates slots")
            }
            Event::QuorumMasterStopped | Event::QuorumMasterKilled if deploy != Deploy::Masters => {
                Some("only a quorum has independent masters")
            }
            Event::MaxPark(_) if sync == Sync::Rate => {
                Some("a rate limiter does not park: it sleeps locally until its tokens are due")
            }
            Event::MaxPark(_) if matches!(deploy, Deploy::Cluster | Deploy::Sentinel) => {
                Some("max_park is the client's timing, not the deployment's: run on one server and the quorum")
            }
            Event::MaxPark(1 | 100) if deploy == Deploy::Masters => {
                Some("the quorum runs 20 ms; 1 ms and 100 ms run on one server")
            }
            Event::WaiterKilled | Event::HolderStopped
                if matches!(deploy, Deploy::Cluster | Deploy::Sentinel) =>
            {
                Some("a party's death does not depend on the deployment: run on one server and the quorum (a killed holder also on a cluster)")
            }
            Event::HolderKilled if deploy == Deploy::Sentinel => {
                Some("a party's death does not depend on the deployment: run on one server, a cluster and the quorum")
            }
            Event::Busy if deploy == Deploy::Sentinel => {
                Some("BUSY is one server's state: run on one server, a cluster and the quorum")
            }
            Event::Rearm if sync != Sync::Latch => Some("only a latch is re-armed"),
            Event::Adjust if sync != Sync::Semaphore => Some("only a semaphore's total is adjusted"),
            _ => None,
        }
    }

    /// The workers' `max_park`: longer than [`BASE`], so that a waiter
    /// that missed its wake-up and came back on its own is seen.
    pub fn max_park(self) -> Duration {
        match self {
            Event::MaxPark(ms) => Duration::from_millis(ms),
            _ => Duration::from_secs(3),
        }
    }

    /// Puts a proxy between the workers and the name's server when the
    /// event needs one (the workers' spec then names the proxy).
    pub fn proxy(self, deployment: &Deployment, spec: &mut Spec) -> Option<FaultProxy> {
        if self != Event::LostReply {
            return None;
        }
        let server = deployment.server_for(&support::lock_key(&spec.name));
        let proxy = FaultProxy::start(server.port());
        for url in &mut spec.urls {
            if *url == server.url() {
                *url = proxy.url();
            }
        }
        Some(proxy)
    }

    /// Does the event to the running cell.
    pub fn fire(self, stage: &mut Stage<'_>) -> Outcome {
        match self {
            Event::HolderKilled => {
                let mut victim = spawn_child_at("hold", stage.spec.encode());
                victim.wait_for_line("HELD", Duration::from_secs(30));
                victim.kill();
                Outcome {
                    allowance: stage.spec.lease,
                    note: "holder killed".into(),
                    victim: None,
                }
            }
            Event::HolderStopped => {
                let mut victim = spawn_child_at("hold", stage.spec.encode());
                victim.wait_for_line("HELD", Duration::from_secs(30));
                victim.signal_stop();
                thread::sleep(stage.spec.lease + Duration::from_millis(500));
                victim.signal_continue();
                Outcome {
                    allowance: stage.spec.lease,
                    note: "holder stopped past its lease".into(),
                    victim: Some(victim),
                }
            }
            Event::WaiterKilled => waiter_killed(stage),
            Event::LostReply => {
                let proxy = stage.proxy.expect("a proxy");
                // A slow link as well: the resend of a lost request comes
                // after other clients' requests sent meanwhile.
                proxy.set_delay(Duration::from_millis(30));
                for _ in 0..LOST_REPLIES {
                    proxy.drop_reply_to(b"EVALSHA");
                    let deadline = Instant::now() + Duration::from_secs(3);
                    while proxy.is_armed() && Instant::now() < deadline {
                        thread::sleep(Duration::from_millis(5));
                    }
                    thread::sleep(BETWEEN_LOSSES);
                }
                proxy.set_delay(Duration::ZERO);
                Outcome {
                    allowance: Duration::ZERO,
                    note: format!("{} replies lost", proxy.dropped_replies()),
                    victim: None,
                }
            }
            Event::Failover | Event::MasterKilled => fail_over(stage.deployment, self),
            Event::Migration => migrate(stage, Duration::from_millis(200)),
            Event::MigrationStalled => migrate(stage, Duration::from_millis(1_500)),
            Event::QuorumMasterStopped => {
                let master = stage.deployment.servers_for("any")[1];
                master.pause();
                thread::sleep(Duration::from_millis(1_500));
                master.resume();
                Outcome {
                    allowance: Duration::ZERO,
                    note: "1 of 3 masters stopped 1.5 s".into(),
                    victim: None,
                }
            }
            Event::QuorumMasterKilled => {
                stage.deployment.servers_for("any")[1].kill();
                thread::sleep(Duration::from_millis(1_000));
                Outcome {
                    allowance: Duration::ZERO,
                    note: "1 of 3 masters killed".into(),
                    victim: None,
                }
            }
            Event::Busy => busy(stage),
            Event::MaxPark(_) | Event::Rearm => {
                thread::sleep(Duration::from_millis(1_000));
                Outcome::default()
            }
            Event::Adjust => adjust(stage),
        }
    }
}

/// The test holds everything, a victim queues behind it and is killed
/// there, then the test lets go.
pub fn waiter_killed(stage: &mut Stage<'_>) -> Outcome {
    let spec = stage.spec;
    let held = stage
        .admin
        .enter_all(spec.permits, Duration::from_secs(20))
        .unwrap()
        .expect("the test got in");
    let marked = held.mark(stage.witness, spec.cap);
    assert!(marked, "the test's own hold overlapped another");
    let mut victim = spawn_child_at("wait", spec.encode());
    victim.wait_for_line("WAITING", Duration::from_secs(30));
    thread::sleep(Duration::from_millis(400)); // it parks
    victim.kill();
    held.unmark(stage.witness, marked);
    held.leave().unwrap();
    redis::cmd("SET")
        .arg("last_exit")
        .arg(crate::worker::now_ms())
        .query::<()>(stage.witness)
        .unwrap();
    // A fair waiter's place outlives it by up to 1.5 max_park + 50 ms.
    let place = spec.max_park + spec.max_park / 2 + Duration::from_millis(50);
    Outcome {
        allowance: if spec.sync == Sync::Fair {
            place
        } else {
            Duration::ZERO
        },
        note: "waiter killed while parked".into(),
        victim: None,
    }
}

/// Whether no sentinel is still failing the master over: one that ends
/// its failover late (by its failover-timeout) sends the replicas their
/// `REPLICAOF` again, which can cut a replica that was already in sync.
fn no_failover_in_progress(sentinels: &testkit::RedisSentinels) -> bool {
    sentinels.sentinels().iter().all(|sentinel| {
        let Ok(mut conn) = sentinel.try_connection() else {
            return false;
        };
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(SERVICE)
            .query::<Vec<String>>(&mut conn)
            .is_ok_and(|fields| {
                fields
                    .chunks(2)
                    .any(|pair| pair[0] == "flags" && !pair[1].contains("failover"))
            })
    })
}

/// Fails the sentinels' master over (by command, or by killing it) and
/// waits until they name the new one.
fn fail_over(deployment: &Deployment, event: Event) -> Outcome {
    let sentinels = deployment.sentinels();
    let old = sentinels.master().port();
    support::wait_for_replica(sentinels.master(), "test-sync");
    let started = Instant::now();
    if event == Event::Failover {
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SERVICE)
            .query::<()>(&mut sentinels.sentinels()[0].connection())
            .unwrap();
    } else {
        sentinels.master().kill();
    }
    eventually(
        Duration::from_secs(30),
        "the sentinels promote the replica",
        || {
            sentinels
                .current_master_port()
                .is_some_and(|port| port != old)
        },
    );
    let promoted = started.elapsed();
    // Under replica_acks(1) the deployment serves again once the new
    // master has a replica in sync: the failover lasts until then.
    eventually(
        Duration::from_secs(30),
        "a replica of the new master in sync",
        || {
            let Some(port) = sentinels.current_master_port() else {
                return false;
            };
            let Some(master) = [sentinels.master()]
                .into_iter()
                .chain(sentinels.replicas())
                .find(|server| server.port() == port)
            else {
                return false;
            };
            let Ok(mut conn) = master.try_connection() else {
                return false;
            };
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut conn)
                .is_ok_and(|info| info.contains("state=online"))
                && no_failover_in_progress(sentinels)
        },
    );
    let took = started.elapsed();
    Outcome {
        allowance: took,
        note: format!(
            "failover took {} ms (promoted at {} ms)",
            took.as_millis(),
            promoted.as_millis()
        ),
        victim: None,
    }
}

/// Moves the name's slot to another master as a reshard does, leaving it
/// `stall` in MIGRATING/IMPORTING before the keys move.
fn migrate(stage: &mut Stage<'_>, stall: Duration) -> Outcome {
    let cluster = stage.deployment.cluster();
    let migration = SlotMigration::of(cluster, &support::lock_key(&stage.spec.name));
    let slot = migration.slot;
    let started = Instant::now();
    migration.begin();
    thread::sleep(stall);
    let moved = migration.move_keys();
    thread::sleep(Duration::from_millis(200));
    migration.finish();
    // While the keys of one name are split between the two masters, Redis
    // refuses every script that touches them all (`TRYAGAIN`): a
    // migration may add its own duration, never a lease.
    Outcome {
        allowance: started.elapsed(),
        note: format!(
            "slot {slot} migrated in {} ms ({moved} keys moved)",
            started.elapsed().as_millis()
        ),
        victim: None,
    }
}

/// A script that runs 1.5 s on the name's server: every other command gets
/// `BUSY` meanwhile (after the 100 ms threshold set here).
fn busy(stage: &mut Stage<'_>) -> Outcome {
    let server = stage
        .deployment
        .server_for(&support::lock_key(&stage.spec.name));
    support::config_set(server, "busy-reply-threshold", "100");
    let mut conn = server.connection();
    let started = Instant::now();
    let _: i64 = redis::cmd("EVAL")
        .arg(
            "local s = redis.call('TIME') local i = 0 \
             while true do \
               i = i + 1 \
               if i % 100000 == 0 then \
                 local n = redis.call('TIME') \
                 if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > tonumber(ARGV[1]) then return 1 end \
               end \
             end",
        )
        .arg(0)
        .arg(1_500_000)
        .query(&mut conn)
        .unwrap();
    let took = started.elapsed();
    Outcome {
        // A baton pushed while the server was busy may be lost: waiters
        // then come back after `max_park` (as `ClientBuilder::max_park` says).
        allowance: took + stage.spec.max_park,
        note: format!("busy for {} ms", took.as_millis()),
        victim: None,
    }
}

/// Three times: an `add_permits(1)` through a proxy loses its reply, and
/// before the client's resend arrives (the proxy holds requests 300 ms)
/// another client reduces the total by one. The total must end where it
/// began.
fn adjust(stage: &mut Stage<'_>) -> Outcome {
    let server = stage
        .deployment
        .server_for(&support::lock_key(&stage.spec.name));
    let proxy = FaultProxy::start(server.port());
    proxy.set_delay(Duration::from_millis(300));
    let mut spec = stage.spec.clone();
    spec.urls = vec![proxy.url()];
    let client = spec.client();
    let adjuster = client.semaphore(&spec.name).unwrap();
    let Handle::Sem(reducer) = stage.admin else {
        unreachable!("adjusting a semaphore")
    };
    let mut errors = Vec::new();
    for round in 1..=3 {
        proxy.drop_reply_to(b"EVALSHA");
        let adding = {
            let adjuster = adjuster.clone();
            thread::spawn(move || adjuster.add_permits(1))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.dropped_replies() < round {
            assert!(Instant::now() < deadline, "the add's reply was never lost");
            thread::sleep(Duration::from_micros(200));
        }
        reducer.reduce_permits(1).unwrap();
        match crate::support::JoinWithin::joined(adding) {
            Ok(_) => {}
            Err(error) => errors.push(crate::subject::kind(&error)),
        }
    }
    Outcome {
        allowance: Duration::ZERO,
        note: format!("3 adds with lost replies, 3 reduces in between; add errors {errors:?}"),
        victim: None,
    }
}

//! The upgradable hold across processes, and as a leased hold: three
//! processes of four threads with occupancy markers, a SIGKILLed holder,
//! renewal by the watchdog, a fixed lease's end, the loss signal and the
//! event hook.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error, Event, HoldKind};
use testkit::{FaultProxy, RedisServer};

use crate::rw_key;
use crate::support::{self, eventually, spawn_child, JoinWithin};

/// This file's child-process roles; false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "mixed-upgradable" => mixed_worker(url),
        "hold-upgradable" => hold_upgradable(url),
        _ => return false,
    }
    true
}

const PROCESSES: usize = 3;
const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 24;

/// 4 threads each read, hold the upgradable read (upgrading every other
/// time: read the counter `value`, upgrade, write it + 1) or write
/// (`value` + 1) under the lock "mixed-up", checking occupancy markers on
/// the data server. Prints its violations, the reads that found the
/// upgradable reader inside, its upgrades and its increments.
fn mixed_worker(url: &str) {
    let client = Client::open(url).unwrap();
    let lock = client.rw_lock("mixed-up").unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    println!("READY");
    let _: (String, String) = redis::cmd("BLPOP")
        .arg("go")
        .arg(30)
        .query(&mut raw)
        .unwrap();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let lock = lock.clone();
            let url = url.to_owned();
            thread::spawn(move || {
                let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut tally = [0u64; 4]; // violations, beside, upgrades, increments
                let wait = Duration::from_secs(60);
                let flag = |raw: &mut redis::Connection, key: &str| -> bool {
                    redis::cmd("SET")
                        .arg(key)
                        .arg(1)
                        .arg("NX")
                        .query(raw)
                        .unwrap()
                };
                let exists = |raw: &mut redis::Connection, key: &str| -> bool {
                    redis::cmd("EXISTS").arg(key).query(raw).unwrap()
                };
                let number = |raw: &mut redis::Connection, key: &str| -> i64 {
                    redis::cmd("GET")
                        .arg(key)
                        .query::<Option<i64>>(raw)
                        .unwrap()
                        .unwrap_or(0)
                };
                let del = |raw: &mut redis::Connection, key: &str| {
                    redis::cmd("DEL").arg(key).query::<()>(raw).unwrap()
                };
                for op in 0..OPS_PER_THREAD {
                    match (t + op) % 4 {
                        0 => {
                            let guard = lock.try_write_for(wait).unwrap().unwrap();
                            let alone = flag(&mut raw, "writer");
                            if !alone
                                || number(&mut raw, "readers") != 0
                                || exists(&mut raw, "upgrader")
                            {
                                tally[0] += 1;
                            }
                            redis::cmd("INCR")
                                .arg("value")
                                .query::<()>(&mut raw)
                                .unwrap();
                            tally[3] += 1;
                            if alone {
                                del(&mut raw, "writer");
                            }
                            guard.unlock().unwrap();
                        }
                        1 => {
                            let up = lock.try_upgradable_read_for(wait).unwrap().unwrap();
                            let one = flag(&mut raw, "upgrader");
                            if !one || exists(&mut raw, "writer") {
                                tally[0] += 1;
                            }
                            let seen = number(&mut raw, "value");
                            thread::sleep(Duration::from_millis(2));
                            if op % 2 == 1 {
                                let write = up.upgrade().unwrap();
                                let alone = flag(&mut raw, "writer");
                                if !alone
                                    || number(&mut raw, "readers") != 0
                                    || number(&mut raw, "value") != seen
                                {
                                    tally[0] += 1;
                                }
                                redis::cmd("SET")
                                    .arg("value")
                                    .arg(seen + 1)
                                    .query::<()>(&mut raw)
                                    .unwrap();
                                tally[2] += 1;
                                tally[3] += 1;
                                if alone {
                                    del(&mut raw, "writer");
                                }
                                write.unlock().unwrap();
                            }
                            if one {
                                del(&mut raw, "upgrader");
                            }
                            up.unlock().unwrap();
                        }
                        _ => {
                            let guard = lock.try_read_for(wait).unwrap().unwrap();
                            redis::cmd("INCR")
                                .arg("readers")
                                .query::<()>(&mut raw)
                                .unwrap();
                            if exists(&mut raw, "writer") {
                                tally[0] += 1;
                            }
                            if exists(&mut raw, "upgrader") {
                                tally[1] += 1;
                            }
                            thread::sleep(Duration::from_millis(3));
                            redis::cmd("DECR")
                                .arg("readers")
                                .query::<()>(&mut raw)
                                .unwrap();
                            guard.unlock().unwrap();
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = [0u64; 4];
    for worker in workers {
        for (sum, n) in total.iter_mut().zip(worker.joined()) {
            *sum += n;
        }
    }
    println!("RESULT {} {} {} {}", total[0], total[1], total[2], total[3]);
}

/// Takes "crash-up" for the upgradable read with a 1 s lease, says so,
/// and waits to be killed.
fn hold_upgradable(url: &str) {
    let client = Client::builder(url)
        .default_lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let guard = client
        .rw_lock("crash-up")
        .unwrap()
        .upgradable_read()
        .unwrap();
    println!("ACQUIRED");
    thread::sleep(Duration::from_secs(30));
    drop(guard);
    panic!("the test should have killed this process");
}

#[test]
fn three_processes_of_four_threads_keep_one_upgradable_reader_and_no_writer_in_between() {
    let server = RedisServer::start();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child("mixed-upgradable", &server))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    let mut raw = server.connection();
    redis::cmd("RPUSH")
        .arg("go")
        .arg(&[1, 2, 3])
        .query::<()>(&mut raw)
        .unwrap();
    let mut total = [0u64; 4];
    for child in &mut children {
        let results = child.lines_with_prefix_until_exit("RESULT", Duration::from_secs(180));
        assert_eq!(results.len(), 1, "{results:?}");
        for (sum, n) in total.iter_mut().zip(results[0].split(' ')) {
            *sum += n.parse::<u64>().unwrap();
        }
    }
    let [violations, beside, upgrades, increments] = total;
    println!("{violations} violations, {beside} reads beside the upgradable reader, {upgrades} upgrades, {increments} increments");
    assert_eq!(
        violations, 0,
        "someone was inside with a writer or a second upgradable reader"
    );
    let value: u64 = redis::cmd("GET").arg("value").query(&mut raw).unwrap();
    assert_eq!(
        value, increments,
        "an increment was lost: a writer got in between"
    );
    let per_process: usize = (0..THREADS)
        .flat_map(|t| (0..OPS_PER_THREAD).map(move |op| (t, op)))
        .filter(|(t, op)| (t + op) % 4 == 1 && op % 2 == 1)
        .count();
    assert_eq!(upgrades, (PROCESSES * per_process) as u64);
    assert!(
        beside > 0,
        "readers never shared the lock with the upgradable reader"
    );
}

#[test]
fn a_sigkilled_upgradable_holder_frees_the_lock_when_its_lease_ends() {
    let server = RedisServer::start();
    let mut holder = spawn_child("hold-upgradable", &server);
    holder.wait_for_line("ACQUIRED", Duration::from_secs(30));
    let acquired_at = Instant::now();
    holder.kill();
    let client = support::client(&server);
    let lock = client.rw_lock("crash-up").unwrap();
    let writer = {
        let lock = lock.clone();
        thread::spawn(move || {
            let write = lock.try_write_for(Duration::from_secs(10)).unwrap();
            (write.is_some(), acquired_at.elapsed())
        })
    };
    let (wrote, waited) = writer.joined();
    assert!(wrote, "the dead holder's lease ends");
    println!("a writer got in {waited:?} after the killed holder took its 1 s lease");
    assert!(
        waited > Duration::from_millis(700) && waited < Duration::from_millis(1_500),
        "a writer got in {waited:?} after the upgradable reader took a 1 s lease"
    );
    lock.try_upgradable_read()
        .unwrap()
        .expect("free for a new upgradable reader")
        .unlock()
        .unwrap();
}

#[test]
fn a_renewed_upgradable_hold_outlives_its_lease_while_held() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(300);
    let client = Client::builder(server.url())
        .default_lease(lease)
        .build()
        .unwrap();
    let other = support::client(&server);
    let (lock, theirs) = (
        client.rw_lock("renewed-up").unwrap(),
        other.rw_lock("renewed-up").unwrap(),
    );
    let up = lock.upgradable_read().unwrap();
    thread::sleep(lease * 4);
    assert!(
        theirs.try_upgradable_read().unwrap().is_none(),
        "it lives on"
    );
    assert!(theirs.try_write().unwrap().is_none(), "it lives on");
    assert!(!up.is_lost());
    assert!(up.valid_until() > Instant::now());
    // The write it upgrades to has its lease mode too.
    let write = up.upgrade().unwrap();
    thread::sleep(lease * 4);
    assert!(theirs.try_read().unwrap().is_none(), "the write lives on");
    write.unlock().unwrap();
    up.unlock().unwrap();
    let stats = client.watchdog_stats();
    assert!(stats.renewals >= 6, "{stats:?}");
    assert_eq!(stats.losses, 0, "{stats:?}");
    theirs.try_write().unwrap().expect("free").unlock().unwrap();
}

#[test]
fn a_fixed_upgradable_lease_ends_on_time_and_its_guard_says_so() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let other = support::client(&server);
    let fixed = client
        .rw_lock("fixed-up")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(300))
        .unwrap();
    let up = fixed.upgradable_read().unwrap();
    let started = Instant::now();
    let write = other
        .rw_lock("fixed-up")
        .unwrap()
        .try_write_for(Duration::from_secs(5))
        .unwrap()
        .expect("the upgradable hold ends with its lease");
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(200) && waited < Duration::from_millis(1_000),
        "{waited:?}"
    );
    assert!(up.is_lost());
    let err = up.try_upgrade().unwrap_err();
    assert!(matches!(err, Error::LockLost { .. }), "{err:?}");
    let err = up.unlock().unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    write.unlock().unwrap();
}

/// What a client's hook was told about acquisitions and losses.
type Told = Arc<Mutex<Vec<(String, HoldKind, Option<u64>)>>>;

#[test]
fn the_loss_signal_and_events_tell_of_the_upgradable_hold() {
    let server = RedisServer::start();
    let told: Told = Arc::default();
    let hook = {
        let told = Arc::clone(&told);
        move |event: &Event<'_>| {
            let seen = match *event {
                Event::Acquired {
                    kind,
                    fencing_token,
                    ..
                } => ("acquired".to_owned(), kind, fencing_token),
                Event::Released { kind, .. } => ("released".to_owned(), kind, None),
                Event::Lost { kind, .. } => ("lost".to_owned(), kind, None),
                _ => return,
            };
            told.lock().unwrap().push(seen);
        }
    };
    let client = Client::builder(server.url())
        .default_lease(Duration::from_millis(300))
        .on_event(hook)
        .build()
        .unwrap();
    let lock = client.rw_lock("signalled").unwrap();
    let up = lock.upgradable_read().unwrap();
    let write = up.upgrade().unwrap();
    let token = write.fencing_token();
    write.unlock().unwrap();
    let lost = up.lost();
    // Renewed meanwhile (a renewal every 100 ms): nothing is lost.
    thread::sleep(Duration::from_millis(700));
    assert!(lost.try_recv().is_err(), "nothing lost yet");
    assert!(!up.is_lost());
    // Someone deletes the hold: the watchdog's next renewal finds it gone.
    redis::cmd("DEL")
        .arg(rw_key("signalled", "upgradable"))
        .query::<()>(&mut server.connection())
        .unwrap();
    let reason = lost
        .recv_timeout(Duration::from_secs(3))
        .expect("the loss signal fires");
    println!("lost: {reason:?}");
    assert!(up.is_lost());
    assert!(matches!(up.upgrade(), Err(Error::LockLost { .. })));
    assert!(up.unlock().unwrap_err().is_lost());
    let told = told.lock().unwrap().clone();
    assert_eq!(
        told,
        [
            ("acquired".to_owned(), HoldKind::Upgradable, None),
            ("acquired".to_owned(), HoldKind::Write, Some(token)),
            ("released".to_owned(), HoldKind::Write, None),
            ("lost".to_owned(), HoldKind::Upgradable, None),
        ]
    );
}

/// A client that reaches `server` through `proxy`, its identity and
/// scripts warmed up so that the next script call is the one under test.
fn warmed_client(proxy: &FaultProxy, name: &str, io_timeout: Duration) -> Client {
    let client = Client::builder(proxy.url())
        .io_timeout(io_timeout)
        .build()
        .unwrap();
    let lock = client.rw_lock(name).unwrap();
    let up = lock.try_upgradable_read().unwrap().expect("free");
    up.try_upgrade().unwrap().expect("alone").unlock().unwrap();
    up.unlock().unwrap();
    client
}

#[test]
fn an_upgradable_read_and_an_upgrade_sent_twice_keep_what_their_first_run_made() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = warmed_client(&proxy, "lost-up", Duration::from_secs(5));
    let mut raw = server.connection();
    let field = |raw: &mut redis::Connection, part: &str, field: &str| -> u64 {
        redis::cmd("HGET")
            .arg(rw_key("lost-up", part))
            .arg(field)
            .query(raw)
            .unwrap()
    };
    // 300 ms per request through the proxy: time to read what the first
    // run stored before the resend arrives.
    proxy.set_delay(Duration::from_millis(300));
    proxy.drop_reply_to(b"EVALSHA");
    let (next, go_on) = std::sync::mpsc::channel::<()>();
    let (taken, upgradable_taken) = std::sync::mpsc::channel();
    let mut direct = server.connection();
    let holder = thread::spawn(move || {
        let lock = client.rw_lock("lost-up").unwrap();
        let up = lock
            .try_upgradable_read()
            .unwrap()
            .expect("the resend finds its own hold");
        taken.send(()).unwrap();
        go_on.recv().unwrap();
        let write = up
            .try_upgrade()
            .unwrap()
            .expect("the resend finds its write hold");
        let token = write.fencing_token();
        // The counter while the write is held (the queued writer issues
        // the next token once it is gone).
        let counter: u64 = redis::cmd("GET")
            .arg(rw_key("lost-up", "fence"))
            .query(&mut direct)
            .unwrap();
        write.unlock().unwrap();
        up.unlock().unwrap();
        (token, counter)
    });
    eventually(Duration::from_secs(10), "the first reply lost", || {
        proxy.dropped_replies() == 1
    });
    let first_hold = field(&mut raw, "upgradable", "req");
    assert!(first_hold > 0);
    // Another client's writer queues before the resend arrives: a fresh
    // upgradable read would be refused behind it, and the hold the first
    // run made would be nobody's.
    let other = support::client(&server);
    let writer = {
        let lock = other.rw_lock("lost-up").unwrap();
        thread::spawn(move || {
            let write = lock.try_write_for(Duration::from_secs(20)).unwrap();
            write
                .expect("the writer gets in after the upgradable reader")
                .unlock()
                .unwrap();
        })
    };
    eventually(Duration::from_secs(10), "the writer's place", || {
        crate::waiting_writers(&mut raw, "lost-up") == 1
    });
    upgradable_taken
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        field(&mut raw, "upgradable", "req"),
        first_hold,
        "the resend took it afresh"
    );
    proxy.drop_reply_to(b"EVALSHA");
    next.send(()).unwrap();
    eventually(Duration::from_secs(10), "the upgrade's reply lost", || {
        proxy.dropped_replies() == 2
    });
    let first_fence = field(&mut raw, "write", "fence");
    let (token, counter) = holder.joined();
    proxy.set_delay(Duration::ZERO);
    assert_eq!(
        token, first_fence,
        "the resend upgraded afresh under a second token"
    );
    assert_eq!(counter, first_fence, "a second token was issued");
    writer.joined();
    let up = other
        .rw_lock("lost-up")
        .unwrap()
        .try_upgradable_read()
        .unwrap();
    up.expect("nothing left behind").unlock().unwrap();
}

#[test]
fn an_upgradable_read_too_few_replicas_confirm_is_undone_at_once() {
    let server = RedisServer::start();
    // No replica exists: every fresh hold is undone on its connection.
    let client = Client::builder(server.url())
        .replica_acks(1, Duration::from_millis(20))
        .build()
        .unwrap();
    let err = client
        .rw_lock("unconfirmed-up")
        .unwrap()
        .try_upgradable_read()
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let mut raw = server.connection();
    let left: bool = redis::cmd("EXISTS")
        .arg(rw_key("unconfirmed-up", "upgradable"))
        .query(&mut raw)
        .unwrap();
    assert!(!left, "the unconfirmed hold is left for its lease");
    let other = support::client(&server);
    let up = other
        .rw_lock("unconfirmed-up")
        .unwrap()
        .try_upgradable_read();
    up.unwrap().expect("free at once").unlock().unwrap();
}

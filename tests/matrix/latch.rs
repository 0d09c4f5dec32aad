//! The latch's cells: rounds instead of entries. Waiters in child
//! processes park on the latch each round; the test counts it down to zero
//! (the event happens in round 2, with the waiters parked) and checks that
//! every waiter of every round woke, how soon, that each count-down
//! counted once, and the waiting cost.

use std::thread;
use std::time::{Duration, Instant};

use crate::cell::{cost, set, within, Report, Setup};
use crate::checks;
use crate::events::{Event, Outcome, Stage, BASE};
use crate::spec::Spec;
use crate::subject::{kind, Handle};
use crate::support::spawn_child_at;
use crate::worker::Tally;

const PROCESSES: usize = 2;
const THREADS: usize = 2;
const ROUNDS: u64 = 4;
/// The round the event happens in.
const EVENT_ROUND: u64 = 2;
/// Count-downs per round.
const COUNT: u64 = 2;
/// How long a waiter waits for its round: longer than the longest event
/// (a Sentinel failover lasts until the new master has a replica in sync,
/// 5-7 s here), which happens while the round's waiters are parked.
const WAITER_TIMEOUT: Duration = Duration::from_secs(20);

/// This file's child-process role; false for another's.
pub(crate) fn run_child(role: &str, text: &str) -> bool {
    if role != "latch-wait" {
        return false;
    }
    let spec = Spec::decode(text);
    let client = spec.client();
    let latch = client.count_down_latch(&spec.name).unwrap();
    println!("READY");
    let mut tally = Tally::default();
    thread::scope(|scope| {
        let threads: Vec<_> = (0..spec.threads)
            .map(|_| scope.spawn(|| wait_rounds(&spec, &latch)))
            .collect();
        for thread in threads {
            let (entries, timeouts, errors) = thread.join().unwrap();
            tally.entries += entries;
            tally.timeouts += timeouts;
            for error in errors {
                let entry = tally.errors.entry(kind(&error)).or_insert((
                    0,
                    error.is_transient(),
                    format!("{error}"),
                ));
                entry.0 += 1;
            }
        }
    });
    tally.print();
    true
}

/// One waiter: each round, says it parks, waits, and says it woke.
fn wait_rounds(spec: &Spec, latch: &redbaton::CountDownLatch) -> (u64, u64, Vec<redbaton::Error>) {
    let mut witness = spec.witness();
    let (mut woke, mut timeouts, mut errors) = (0, 0, Vec::new());
    let mut last = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let round: Option<u64> = redis::cmd("GET").arg("round").query(&mut witness).unwrap();
        let stop: bool = redis::cmd("EXISTS")
            .arg("stop")
            .query(&mut witness)
            .unwrap();
        if stop {
            break;
        }
        let Some(round) = round.filter(|r| *r > last) else {
            thread::sleep(Duration::from_millis(5));
            continue;
        };
        last = round;
        redis::cmd("RPUSH")
            .arg(format!("parked:{round}"))
            .arg(1)
            .query::<()>(&mut witness)
            .unwrap();
        let opened = loop {
            match latch.wait_for(WAITER_TIMEOUT) {
                Ok(opened) => break opened,
                Err(error) => {
                    let transient = error.is_transient();
                    errors.push(error);
                    if !transient {
                        break false;
                    }
                }
            }
        };
        if opened {
            woke += 1;
        } else {
            timeouts += 1;
        }
        redis::cmd("RPUSH")
            .arg(format!("woke:{round}"))
            .arg(u8::from(opened))
            .query::<()>(&mut witness)
            .unwrap();
    }
    (woke, timeouts, errors)
}

/// The latch's count, riding out a deployment event (u64::MAX when Redis
/// kept failing for 10 s).
fn count_of(latch: &redbaton::CountDownLatch) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match latch.count() {
            Ok(count) => return count,
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(50));
            }
            Err(_) => return u64::MAX,
        }
    }
}

fn llen(witness: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("LLEN").arg(key).query(witness).unwrap()
}

/// Runs the rounds; the event in round [`EVENT_ROUND`].
pub fn run(setup: &Setup, event: Event) -> Report {
    let (spec, deployment) = (&setup.spec, &setup.deployment);
    let mut report = Report::default();
    let waiters = PROCESSES * THREADS;
    let mut child_spec = spec.clone();
    child_spec.threads = THREADS;
    let admin_client = setup.direct.client();
    let admin = Handle::new(&setup.direct, &admin_client);
    let Handle::Latch(observer) = &admin else {
        unreachable!("a latch cell")
    };
    // The coordinator counts down through the workers' spec: through the
    // proxy when replies are to be lost.
    let coordinator_client = spec.client();
    let coordinator = coordinator_client.count_down_latch(&spec.name).unwrap();
    let mut witness = spec.witness();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child_at("latch-wait", child_spec.encode()))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    let started = Instant::now();
    let s0 = checks::snapshot(deployment);
    let (mut armed, mut max_wake, mut outcome) = (false, Duration::ZERO, Outcome::default());
    let mut counts_after_one = Vec::new();
    let mut counts_at_start = Vec::new();
    let mut coordinator_errors = Vec::new();
    for round in 1..=ROUNDS {
        if !armed {
            assert!(
                coordinator.try_set_count(COUNT).unwrap(),
                "round {round} could not start: the last one still counts ({} left; count-downs \
                 of round {}: {:?}; errors {coordinator_errors:?})",
                count_of(observer),
                round - 1,
                counts_after_one,
            );
        }
        armed = false;
        counts_at_start.push(count_of(observer));
        set(&mut witness, "round", round);
        let parked = within(Duration::from_secs(10), || {
            llen(&mut witness, &format!("parked:{round}")) == waiters
        });
        assert!(parked, "round {round}: the waiters did not come");
        thread::sleep(Duration::from_millis(300)); // they park
        if round == EVENT_ROUND {
            outcome = match event {
                Event::Rearm | Event::LostReply => Outcome::default(),
                Event::WaiterKilled => {
                    let mut victim = spawn_child_at("wait", setup.direct.encode());
                    victim.wait_for_line("WAITING", Duration::from_secs(30));
                    thread::sleep(Duration::from_millis(400));
                    victim.kill();
                    Outcome {
                        note: "a waiter killed while parked".into(),
                        ..Outcome::default()
                    }
                }
                _ => event.fire(&mut Stage {
                    deployment,
                    spec,
                    admin: &admin,
                    witness: &mut witness,
                    proxy: setup.proxy.as_ref(),
                }),
            };
        }
        let lose = event == Event::LostReply && round == EVENT_ROUND;
        for counted in 0..COUNT {
            if lose && counted == COUNT - 1 {
                // The count-down that opens the round loses its reply, and
                // the next round is armed before its resend arrives (the
                // proxy holds requests 300 ms): the resend must not count
                // the next round down.
                let proxy = setup.proxy.as_ref().unwrap();
                let dropped = proxy.dropped_replies();
                proxy.set_delay(Duration::from_millis(300));
                proxy.drop_reply_to(b"EVALSHA");
                let counting = {
                    let coordinator = coordinator.clone();
                    thread::spawn(move || coordinator.count_down())
                };
                let deadline = Instant::now() + Duration::from_secs(10);
                while proxy.dropped_replies() == dropped {
                    assert!(
                        Instant::now() < deadline,
                        "the count-down's reply was never lost"
                    );
                    thread::sleep(Duration::from_micros(200));
                }
                armed = round < ROUNDS && observer.try_set_count(COUNT).unwrap();
                if let Err(error) = crate::support::JoinWithin::joined(counting) {
                    coordinator_errors.push(kind(&error));
                }
                proxy.set_delay(Duration::ZERO);
                continue;
            }
            if lose {
                setup.proxy.as_ref().unwrap().drop_reply_to(b"EVALSHA");
            }
            // A count-down whose reply was lost may come back as an error;
            // the count below tells whether it counted (once).
            let counted = loop {
                match coordinator.count_down() {
                    Ok(_) => break true,
                    // Counted on the master, and sent again in the
                    // background until its replicas confirm it: calling
                    // again would count twice (as the docs say).
                    Err(error @ redbaton::Error::NotReplicated { .. }) => {
                        coordinator_errors.push(kind(&error));
                        break true;
                    }
                    Err(error) if error.is_transient() && !lose => {
                        coordinator_errors.push(kind(&error));
                        thread::sleep(Duration::from_millis(50));
                    }
                    Err(error) => {
                        coordinator_errors.push(kind(&error));
                        break false;
                    }
                }
            };
            let _ = counted;
            if counts_after_one.len() < round as usize {
                // A count-down the replicas did not confirm is sent again
                // in the background: the count may take a moment to show
                // it (and must then show it once).
                let mut count = count_of(observer);
                within(Duration::from_secs(5), || {
                    count = count_of(observer);
                    count < COUNT
                });
                counts_after_one.push(count);
            }
        }
        let opened = Instant::now();
        if event == Event::Rearm && round < ROUNDS {
            armed = coordinator.try_set_count(COUNT).unwrap();
        }
        let allowed = BASE + outcome.allowance;
        let all_woke = within(allowed + Duration::from_secs(7), || {
            llen(&mut witness, &format!("woke:{round}")) >= waiters
        });
        let wake = opened.elapsed();
        max_wake = max_wake.max(wake);
        let results: Vec<u8> = redis::cmd("LRANGE")
            .arg(format!("woke:{round}"))
            .arg(0)
            .arg(-1)
            .query(&mut witness)
            .unwrap();
        let woke = results.iter().filter(|r| **r == 1).count();
        report.check(all_woke && woke == waiters, || {
            format!("round {round}: {woke} of {waiters} waiters woke ({results:?})")
        });
        report.check(wake <= allowed, || {
            format!(
                "round {round}: the last waiter woke {} ms after the latch opened (allowed {} ms)",
                wake.as_millis(),
                allowed.as_millis()
            )
        });
    }
    let s1 = checks::snapshot(deployment);
    let ran = started.elapsed();
    set(&mut witness, "stop", 1);
    let (mut results, mut errors) = (Vec::new(), Vec::new());
    for child in &mut children {
        for line in child.lines_with_prefix_until_exit("", Duration::from_secs(60)) {
            if let Some(result) = line.strip_prefix("RESULT ") {
                results.push(result.to_owned());
            } else if let Some(error) = line.strip_prefix("ERROR ") {
                errors.push(error.to_owned());
            }
        }
    }
    let tally = Tally::parse(&results, &errors);
    let spent = cost(&s0, &s1, waiters, ran);
    report.figure(format!(
        "{ROUNDS} rounds × {waiters} waiters: {} wake-ups, {} timeouts, last wake-up ≤ {} ms",
        tally.entries,
        tally.timeouts,
        max_wake.as_millis()
    ));
    report.figure(format!(
        "count after one count-down, per round: {counts_after_one:?}"
    ));
    report.figure(format!("cost {spent:.0} cmd/waiter/s"));
    if !outcome.note.is_empty() {
        report.figure(outcome.note.clone());
    }
    report.figure(format!("coordinator errors {coordinator_errors:?}"));
    report.errors(&tally);
    report.figure(format!("count as each round began: {counts_at_start:?}"));
    report.check(counts_at_start.iter().all(|c| *c == COUNT), || {
        format!("a round began with a count-down of the last one in it: {counts_at_start:?}")
    });
    report.check(counts_after_one.iter().all(|c| *c == COUNT - 1), || {
        format!("a count-down did not count exactly once: counts after one {counts_after_one:?}")
    });
    report.check(spent <= 100.0, || {
        format!("waiting cost {spent:.0} cmd/waiter/s")
    });
    let open = within(Duration::from_secs(3), || observer.count().ok() == Some(0));
    report.check(open, || "the latch did not end open".into());
    report
}

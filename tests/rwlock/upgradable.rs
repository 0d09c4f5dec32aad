//! The upgradable read: one holder at a time beside plain readers, writers
//! kept out; an upgrade waits for the readers, holds fresh readers back,
//! lets no writer in first and is woken by its baton; the ways back (write
//! → upgradable → read); the re-entry rules.

use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::Error;

use crate::across_topologies;
use crate::support::{eventually, parked, JoinWithin};
use crate::{rw_key, rw_state, waiting_writers};

/// Whether the upgradable hold of `name` carries a waiting upgrade's mark.
pub(crate) fn upgrade_marked(raw: &mut redis::Connection, name: &str) -> bool {
    redis::cmd("HEXISTS")
        .arg(rw_key(name, "upgradable"))
        .arg("upgrading")
        .query(raw)
        .unwrap()
}

/// What happened, in order, with when.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(&'static str, Instant)>>>);

impl Log {
    fn push(&self, what: &'static str) {
        self.0.lock().unwrap().push((what, Instant::now()));
    }

    fn whats(&self) -> Vec<&'static str> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(what, _)| *what)
            .collect()
    }

    fn at(&self, what: &str) -> Instant {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(w, _)| *w == what)
            .map(|(_, at)| *at)
            .unwrap_or_else(|| panic!("{what} never happened"))
    }
}

across_topologies! {
    but_masters;
    /// One client holds the upgradable read: another is refused it, may
    /// read beside it, and no writer gets in until it is released; then
    /// the upgradable read is refused beside a writer.
    fn one_upgradable_reader_at_a_time_beside_plain_readers_and_no_writer(deployment) {
        let (a, b, c) = (deployment.client(), deployment.client(), deployment.client());
        let (mine, theirs, writer) = (
            a.rw_lock("one").unwrap(),
            b.rw_lock("one").unwrap(),
            c.rw_lock("one").unwrap(),
        );
        let up = mine.upgradable_read().unwrap();
        assert!(theirs.try_upgradable_read().unwrap().is_none(), "a second upgradable reader");
        assert!(
            theirs.try_upgradable_read_for(Duration::from_millis(300)).unwrap().is_none(),
            "a second upgradable reader, waiting"
        );
        let read = theirs.try_read().unwrap().expect("a plain reader shares it");
        assert!(writer.try_write().unwrap().is_none(), "a writer beside readers");
        read.unlock().unwrap();
        assert!(writer.try_write().unwrap().is_none(), "a writer beside the upgradable reader");
        assert!(writer.try_write_for(Duration::from_millis(300)).unwrap().is_none());
        up.unlock().unwrap();
        let write = writer.try_write().unwrap().expect("free once it is released");
        assert!(theirs.try_upgradable_read().unwrap().is_none(), "beside a writer");
        write.unlock().unwrap();
        theirs.try_upgradable_read().unwrap().expect("free").unlock().unwrap();
    }
}

/// One thread's tally in [`threads_keep_one_upgradable_reader_and_writers_alone`].
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    violations: u64,
    /// Reads that saw the upgradable reader inside with them.
    beside: u64,
    upgrades: u64,
    increments: u64,
}

across_topologies! {
    but_masters;
    /// Two clients of four threads read, hold the upgradable read (and
    /// upgrade every other time, incrementing a counter read before the
    /// upgrade) or write (incrementing it too), with occupancy markers in
    /// Redis: a writer (or upgraded writer) is alone, the upgradable reader
    /// is one, readers see no writer, and the counter never loses an
    /// increment (no writer got in between an upgradable read and its
    /// upgrade).
    fn threads_keep_one_upgradable_reader_and_writers_alone(deployment) {
        const OPS: usize = 16;
        let marker = |part: &str| format!("{{occupancy}}:{part}");
        let data = deployment.server_for(&marker("value"));
        let clients: Vec<_> = (0..2).map(|_| deployment.client()).collect();
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let lock = clients[t % 2].rw_lock("occupied").unwrap();
                let mut raw = data.connection();
                thread::spawn(move || {
                    let mut tally = Tally::default();
                    let wait = Duration::from_secs(60);
                    for op in 0..OPS {
                        match (t + op) % 4 {
                            0 => {
                                let guard = lock.try_write_for(wait).unwrap().unwrap();
                                let alone: bool = redis::cmd("SET").arg(marker("writer")).arg(1).arg("NX").query(&mut raw).unwrap();
                                let readers: i64 = redis::cmd("GET").arg(marker("readers")).query::<Option<i64>>(&mut raw).unwrap().unwrap_or(0);
                                let upgradable: bool = redis::cmd("EXISTS").arg(marker("upgrader")).query(&mut raw).unwrap();
                                if !alone || readers != 0 || upgradable {
                                    tally.violations += 1;
                                }
                                let _: i64 = redis::cmd("INCR").arg(marker("value")).query(&mut raw).unwrap();
                                tally.increments += 1;
                                if alone {
                                    let _: () = redis::cmd("DEL").arg(marker("writer")).query(&mut raw).unwrap();
                                }
                                guard.unlock().unwrap();
                            }
                            1 => {
                                let up = lock.try_upgradable_read_for(wait).unwrap().unwrap();
                                let one: bool = redis::cmd("SET").arg(marker("upgrader")).arg(1).arg("NX").query(&mut raw).unwrap();
                                let writer: bool = redis::cmd("EXISTS").arg(marker("writer")).query(&mut raw).unwrap();
                                if !one || writer {
                                    tally.violations += 1;
                                }
                                let seen: i64 = redis::cmd("GET").arg(marker("value")).query::<Option<i64>>(&mut raw).unwrap().unwrap_or(0);
                                thread::sleep(Duration::from_millis(3));
                                if op % 2 == 1 {
                                    let write = up.try_upgrade_for(wait).unwrap().unwrap();
                                    let alone: bool = redis::cmd("SET").arg(marker("writer")).arg(1).arg("NX").query(&mut raw).unwrap();
                                    let readers: i64 = redis::cmd("GET").arg(marker("readers")).query::<Option<i64>>(&mut raw).unwrap().unwrap_or(0);
                                    let now: i64 = redis::cmd("GET").arg(marker("value")).query::<Option<i64>>(&mut raw).unwrap().unwrap_or(0);
                                    if !alone || readers != 0 || now != seen {
                                        tally.violations += 1;
                                    }
                                    let _: () = redis::cmd("SET").arg(marker("value")).arg(seen + 1).query(&mut raw).unwrap();
                                    tally.increments += 1;
                                    tally.upgrades += 1;
                                    if alone {
                                        let _: () = redis::cmd("DEL").arg(marker("writer")).query(&mut raw).unwrap();
                                    }
                                    write.unlock().unwrap();
                                }
                                if one {
                                    let _: () = redis::cmd("DEL").arg(marker("upgrader")).query(&mut raw).unwrap();
                                }
                                up.unlock().unwrap();
                            }
                            _ => {
                                let guard = lock.try_read_for(wait).unwrap().unwrap();
                                let _: i64 = redis::cmd("INCR").arg(marker("readers")).query(&mut raw).unwrap();
                                let writer: bool = redis::cmd("EXISTS").arg(marker("writer")).query(&mut raw).unwrap();
                                if writer {
                                    tally.violations += 1;
                                }
                                let upgradable: bool = redis::cmd("EXISTS").arg(marker("upgrader")).query(&mut raw).unwrap();
                                if upgradable {
                                    tally.beside += 1;
                                }
                                thread::sleep(Duration::from_millis(4));
                                let _: i64 = redis::cmd("DECR").arg(marker("readers")).query(&mut raw).unwrap();
                                guard.unlock().unwrap();
                            }
                        }
                    }
                    tally
                })
            })
            .collect();
        let mut total = Tally::default();
        for worker in workers {
            let tally = worker.joined();
            total.violations += tally.violations;
            total.beside += tally.beside;
            total.upgrades += tally.upgrades;
            total.increments += tally.increments;
        }
        println!("{total:?}");
        let value: u64 = redis::cmd("GET").arg(marker("value")).query(&mut data.connection()).unwrap();
        assert_eq!(total.violations, 0, "someone was inside with a writer or a second upgradable reader");
        assert_eq!(value, total.increments, "an increment was lost: a writer got in between");
        // Upgradable reads on ops `(t + op) % 4 == 1`, upgraded on odd ops.
        let upgrades = (0..8)
            .flat_map(|t| (0..OPS).map(move |op| (t, op)))
            .filter(|(t, op)| (t + op) % 4 == 1 && op % 2 == 1)
            .count();
        assert_eq!(total.upgrades, upgrades as u64);
        assert!(total.beside > 0, "readers never shared the lock with the upgradable reader");
    }
}

across_topologies! {
    but_masters;
    /// A reader holds; the upgradable reader's upgrade waits for it while
    /// a writer that came earlier waits too (and looks again every 100 ms).
    /// The reader's release wakes the upgrade (within a second, parks of
    /// 10 s); the writer gets in only once the write hold and then the
    /// upgradable hold are gone.
    fn an_upgrade_waits_for_the_readers_and_a_writer_that_waited_longer_does_not_get_in_first(deployment) {
        let name = "order";
        let log = Log::default();
        let reader_client = deployment.client();
        let read = reader_client.rw_lock(name).unwrap().read().unwrap();

        let (taken, upgradable_taken) = mpsc::channel();
        let (go, upgrade_now) = mpsc::channel::<()>();
        let upgrader_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let upgrader = {
            let log = log.clone();
            thread::spawn(move || {
                let lock = upgrader_client.rw_lock(name).unwrap();
                let up = lock.upgradable_read().unwrap();
                taken.send(()).unwrap();
                upgrade_now.recv().unwrap();
                let write = up.try_upgrade_for(Duration::from_secs(30)).unwrap().expect("upgraded");
                log.push("upgraded");
                thread::sleep(Duration::from_millis(300));
                log.push("write released");
                write.unlock().unwrap();
                // Back to the upgradable read: still no writer.
                thread::sleep(Duration::from_millis(300));
                log.push("upgradable released");
                up.unlock().unwrap();
            })
        };
        upgradable_taken.recv_timeout(Duration::from_secs(10)).unwrap();

        // The writer looks again every 100 ms: it would find any gap.
        let writer_client = deployment.builder().max_park(Duration::from_millis(100)).build().unwrap();
        let writer = {
            let log = log.clone();
            thread::spawn(move || {
                let lock = writer_client.rw_lock(name).unwrap();
                let write = lock.try_write_for(Duration::from_secs(30)).unwrap().expect("the writer gets in in the end");
                log.push("writer in");
                write.unlock().unwrap();
            })
        };
        let mut raw = deployment.server_for(&rw_key(name, "writers")).connection();
        eventually(Duration::from_secs(10), "the writer's place", || waiting_writers(&mut raw, name) == 1);
        go.send(()).unwrap();
        eventually(Duration::from_secs(10), "the upgrade's mark", || upgrade_marked(&mut raw, name));
        thread::sleep(Duration::from_millis(200));
        log.push("read released");
        read.unlock().unwrap();
        upgrader.joined();
        writer.joined();
        assert_eq!(
            log.whats(),
            ["read released", "upgraded", "write released", "upgradable released", "writer in"]
        );
        let woken = log.at("upgraded").duration_since(log.at("read released"));
        println!("upgraded {woken:?} after the last reader left");
        assert!(woken < Duration::from_secs(1), "the upgrade got in {woken:?} after the last reader left");
        assert!(!upgrade_marked(&mut raw, name));
    }
}

across_topologies! {
    but_masters;
    /// While an upgrade waits, fresh readers wait behind it (a reader
    /// re-entering its hold does not); when the upgrade gives up at its
    /// deadline, a reader parked behind it gets in at once, and the
    /// upgradable reader keeps its hold.
    fn a_waiting_upgrade_holds_fresh_readers_back_until_it_gives_up(deployment) {
        let name = "held-back";
        let holder = deployment.client();
        let holder_lock = holder.rw_lock(name).unwrap();
        let read = holder_lock.read().unwrap();

        let (taken, upgradable_taken) = mpsc::channel();
        let (done, finish) = mpsc::channel::<()>();
        let upgrader_client = deployment.builder().max_park(Duration::from_secs(5)).build().unwrap();
        let upgrader = thread::spawn(move || {
            let lock = upgrader_client.rw_lock(name).unwrap();
            let up = lock.upgradable_read().unwrap();
            taken.send(()).unwrap();
            let got = up.try_upgrade_for(Duration::from_millis(1_500)).unwrap();
            assert!(got.is_none(), "a reader holds all along");
            let gave_up_at = Instant::now();
            assert!(!up.is_lost(), "it keeps its upgradable read");
            finish.recv().unwrap();
            up.unlock().unwrap();
            gave_up_at
        });
        upgradable_taken.recv_timeout(Duration::from_secs(10)).unwrap();
        let mut raw = deployment.server_for(&rw_key(name, "upgradable")).connection();
        eventually(Duration::from_secs(10), "the upgrade's mark", || upgrade_marked(&mut raw, name));

        let again = holder_lock.try_read().unwrap().expect("a reader re-enters its hold");
        drop(again);
        let fresh_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let fresh = fresh_client.rw_lock(name).unwrap();
        assert!(fresh.try_read().unwrap().is_none(), "a fresh reader waits behind the upgrade");
        let reader = thread::spawn(move || {
            let guard = fresh.try_read_for(Duration::from_secs(20)).unwrap();
            (guard.is_some(), Instant::now())
        });
        let (read_fresh, read_at) = reader.joined();
        done.send(()).unwrap();
        let gave_up_at = upgrader.joined();
        assert!(read_fresh);
        assert!(read_at + Duration::from_millis(20) >= gave_up_at, "not before the upgrade gave up");
        let late = read_at.saturating_duration_since(gave_up_at);
        // The mark would have lasted 5.5 s from the upgrade's last attempt.
        assert!(late < Duration::from_millis(700), "the reader got in {late:?} after the upgrade gave up");
        assert!(!upgrade_marked(&mut raw, name), "the mark is off");
        read.unlock().unwrap();
    }
}

across_topologies! {
    but_masters;
    /// Upgradable → write → upgradable → write again (a fresh, larger
    /// fencing token) → read; then a writer's way down: write →
    /// upgradable. Others are let in, or kept out, at each step.
    fn upgrade_and_downgrade_round_trips(deployment) {
        let (a, b, c) = (deployment.client(), deployment.client(), deployment.client());
        let (lock, reader, writer) = (
            a.rw_lock("trips").unwrap(),
            b.rw_lock("trips").unwrap(),
            c.rw_lock("trips").unwrap(),
        );
        let up = lock.upgradable_read().unwrap();
        let first = up.upgrade().unwrap();
        let first_token = first.fencing_token();
        assert!(reader.try_read().unwrap().is_none(), "written");
        first.unlock().unwrap();
        let shared = reader.try_read().unwrap().expect("back to the upgradable read: readers share it");
        assert!(writer.try_write().unwrap().is_none(), "still upgradable: no writer");
        assert!(up.try_upgrade().unwrap().is_none(), "a reader holds: try_upgrade gives up at once");
        shared.unlock().unwrap();
        let second = up.try_upgrade().unwrap().expect("no reader left");
        assert!(second.fencing_token() > first_token, "every upgrade is a fresh write hold");
        let inner = up.upgrade().unwrap();
        assert_eq!(inner.fencing_token(), second.fencing_token(), "upgrading while writing re-enters");
        drop(inner);
        let second_token = second.fencing_token();
        second.unlock().unwrap();

        let read = up.downgrade().unwrap();
        let theirs = reader.try_upgradable_read().unwrap().expect("free for another after a downgrade");
        assert!(writer.try_write().unwrap().is_none(), "read and upgradable holds: no writer");
        theirs.unlock().unwrap();
        assert!(writer.try_write().unwrap().is_none(), "the downgraded reader still reads");
        read.unlock().unwrap();

        let write = writer.try_write().unwrap().expect("free");
        assert!(write.fencing_token() > second_token);
        let down = writer.try_upgradable_read().unwrap().expect("a writer takes the upgradable read at once");
        assert!(reader.try_read().unwrap().is_none(), "still written");
        write.unlock().unwrap();
        let beside = reader.try_read().unwrap().expect("write → upgradable: readers come in");
        beside.unlock().unwrap();
        assert!(reader.try_write().unwrap().is_none(), "no writer beside the upgradable read");
        down.unlock().unwrap();
        reader.try_write().unwrap().expect("free").unlock().unwrap();
    }
}

across_topologies! {
    but_masters;
    /// Who may ask for what: a thread that only reads is refused the
    /// upgradable read at once (no script sent, nothing changed); the
    /// upgradable reader re-enters, reads at once even past a waiting
    /// writer, and its `write()` is an upgrade; its own read hold is not
    /// in the way of its upgrade.
    fn re_entry_rules_of_the_upgradable_read(deployment) {
        let (mine, theirs) = (deployment.client(), deployment.client());
        let (lock, other) = (mine.rw_lock("rules").unwrap(), theirs.rw_lock("rules").unwrap());

        // A reader asks for the upgradable read: refused, locally.
        let read = lock.read().unwrap();
        let server = deployment.server_for(&rw_key("rules", "upgradable"));
        let mut raw = server.connection();
        let before = rw_state(&mut raw, "rules");
        let calls = server.command_calls();
        let errors = [
            lock.upgradable_read().unwrap_err(),
            lock.try_upgradable_read().unwrap_err(),
            lock.try_upgradable_read_for(Duration::from_secs(5)).unwrap_err(),
            lock.try_upgradable_read_until(Instant::now() + Duration::from_secs(5)).unwrap_err(),
        ];
        for err in errors {
            assert!(matches!(&err, Error::UpgradeRefused { name } if name == "rules"), "{err:?}");
        }
        let sent = server.commands_since(&calls);
        let scripts: u64 = ["evalsha", "eval"].iter().filter_map(|c| sent.get(*c)).sum();
        assert_eq!(scripts, 0, "no script was sent: {sent:?}");
        assert_eq!(rw_state(&mut raw, "rules"), before);
        read.unlock().unwrap();

        // Re-entry: the hold ends with its last guard.
        let outer = lock.upgradable_read().unwrap();
        let inner = lock.try_upgradable_read().unwrap().expect("the holder re-enters");
        inner.unlock().unwrap();
        assert!(other.try_upgradable_read().unwrap().is_none(), "one level is left");

        // The holder reads at once, even while a writer waits.
        let waiting = {
            let other = other.clone();
            thread::spawn(move || other.try_write_for(Duration::from_secs(30)).unwrap().map(|w| w.fencing_token()))
        };
        eventually(Duration::from_secs(10), "the writer's place", || waiting_writers(&mut raw, "rules") == 1);
        assert!(other.try_read().is_ok_and(|r| r.is_none()), "a fresh reader waits behind the writer");
        let own_read = lock.try_read().unwrap().expect("the upgradable reader reads at once");

        // Its write() is an upgrade, which its own read hold does not stop.
        let write = lock.try_write().unwrap().expect("an upgrade: only its own read hold is there");
        drop(own_read);
        write.unlock().unwrap();
        assert!(!waiting.is_finished(), "the writer still waits for the upgradable read");
        outer.unlock().unwrap();
        assert!(waiting.joined().is_some(), "the writer gets in after it");
    }
}

across_topologies! {
    but_masters;
    /// A waiting upgrade parks (10 s parks) and sends next to nothing
    /// while the reader holds; the reader's release wakes it within a
    /// second.
    fn a_waiting_upgrade_is_woken_by_the_last_readers_release_not_by_polling(deployment) {
        let name = "woken-upgrade";
        let reader_client = deployment.client();
        let read = reader_client.rw_lock(name).unwrap().read().unwrap();
        let (taken, upgradable_taken) = mpsc::channel();
        let upgrader_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let upgrader = thread::spawn(move || {
            let lock = upgrader_client.rw_lock(name).unwrap();
            let up = lock.upgradable_read().unwrap();
            taken.send(()).unwrap();
            let write = up.try_upgrade_for(Duration::from_secs(30)).unwrap();
            let at = Instant::now();
            assert!(write.is_some(), "upgraded");
            at
        });
        upgradable_taken.recv_timeout(Duration::from_secs(10)).unwrap();
        let server = deployment.server_for(&rw_key(name, "upbaton"));
        let mut raw = server.connection();
        eventually(Duration::from_secs(10), "the upgrade parks", || {
            upgrade_marked(&mut raw, name) && parked(server) >= 1
        });
        let before = server.command_calls();
        thread::sleep(Duration::from_secs(2));
        let during = server.commands_since(&before);
        let attempts: u64 = ["evalsha", "eval"].iter().filter_map(|c| during.get(*c)).sum();
        let parks = during.get("blpop").copied().unwrap_or(0);
        println!("while parked for 2 s: {attempts} script calls, {parks} BLPOPs; all: {during:?}");
        assert!(attempts <= 1 && parks <= 1, "the upgrade polls: {during:?}");
        let released_at = Instant::now();
        read.unlock().unwrap();
        let upgraded_at = upgrader.joined();
        let woken = upgraded_at.saturating_duration_since(released_at);
        println!("upgraded {woken:?} after the release");
        assert!(woken < Duration::from_secs(1), "upgraded {woken:?} after the release: not by a baton");
    }
}

across_topologies! {
    but_masters;
    /// Threads of two clients wait for the upgradable read (10 s parks);
    /// each release wakes the next within a second.
    fn waiting_upgradable_readers_are_woken_by_each_release(deployment) {
        let name = "woken-upgradable";
        let holder = deployment.client();
        let held = holder.rw_lock(name).unwrap().upgradable_read().unwrap();
        let log = Log::default();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
                let log = log.clone();
                thread::spawn(move || {
                    let lock = client.rw_lock(name).unwrap();
                    let up = lock.try_upgradable_read_for(Duration::from_secs(30)).unwrap().expect("in the end");
                    log.push("in");
                    thread::sleep(Duration::from_millis(200));
                    log.push("out");
                    up.unlock().unwrap();
                })
            })
            .collect();
        let server = deployment.server_for(&rw_key(name, "ubaton"));
        eventually(Duration::from_secs(10), "both waiters park", || parked(server) >= 2);
        log.push("released");
        held.unlock().unwrap();
        for waiter in waiters {
            waiter.joined();
        }
        let entries = log.0.lock().unwrap().clone();
        let whats: Vec<_> = entries.iter().map(|(what, _)| *what).collect();
        assert_eq!(whats, ["released", "in", "out", "in", "out"], "one at a time");
        for pair in [(0, 1), (2, 3)] {
            let woken = entries[pair.1].1.duration_since(entries[pair.0].1);
            assert!(woken < Duration::from_secs(1), "woken {woken:?} after a release: not by a baton");
        }
    }
}

across_topologies! {
    but_masters;
    /// A fresh reader held back by a waiting upgrade waits through the
    /// upgraded write too, and the write's release wakes it (10 s parks).
    fn a_reader_held_back_by_an_upgrade_is_woken_when_the_upgraded_write_ends(deployment) {
        let name = "after-upgrade";
        let log = Log::default();
        let holder = deployment.client();
        let read = holder.rw_lock(name).unwrap().read().unwrap();
        let (taken, upgradable_taken) = mpsc::channel();
        let upgrader_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let upgrader = {
            let log = log.clone();
            thread::spawn(move || {
                let lock = upgrader_client.rw_lock(name).unwrap();
                let up = lock.upgradable_read().unwrap();
                taken.send(()).unwrap();
                let write = up.try_upgrade_for(Duration::from_secs(30)).unwrap().expect("upgraded");
                thread::sleep(Duration::from_millis(300));
                log.push("write released");
                write.unlock().unwrap();
                up.unlock().unwrap();
            })
        };
        upgradable_taken.recv_timeout(Duration::from_secs(10)).unwrap();
        let server = deployment.server_for(&rw_key(name, "rbaton"));
        let mut raw = server.connection();
        eventually(Duration::from_secs(10), "the upgrade's mark", || upgrade_marked(&mut raw, name));
        let reader_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let reader = {
            let log = log.clone();
            thread::spawn(move || {
                let lock = reader_client.rw_lock(name).unwrap();
                let guard = lock.try_read_for(Duration::from_secs(30)).unwrap().expect("read in the end");
                log.push("reader in");
                guard.unlock().unwrap();
            })
        };
        eventually(Duration::from_secs(10), "the upgrade and the reader park", || parked(server) >= 2);
        read.unlock().unwrap();
        upgrader.joined();
        reader.joined();
        assert_eq!(log.whats(), ["write released", "reader in"]);
        let woken = log.at("reader in").duration_since(log.at("write released"));
        assert!(woken < Duration::from_secs(1), "the reader got in {woken:?} after the write ended: not by a baton");
    }
}

across_topologies! {
    but_masters;
    /// Four reader threads keep the lock read-held without a gap (each
    /// holds 20 ms, and they overlap); an upgrade still gets in within
    /// 1.5 s, alone, and the readers go on after it.
    fn an_upgrade_is_not_starved_by_a_stream_of_readers(deployment) {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let readers_client = deployment.client();
        let lock = readers_client.rw_lock("up-stream").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let inside = Arc::new(AtomicUsize::new(0));
        let reads = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..4)
            .map(|i| {
                let (lock, stop, inside, reads) =
                    (lock.clone(), Arc::clone(&stop), Arc::clone(&inside), Arc::clone(&reads));
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(5 * i));
                    while !stop.load(Ordering::SeqCst) {
                        let guard = lock.try_read_for(Duration::from_secs(20)).unwrap().expect("read");
                        inside.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(20));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        reads.fetch_add(1, Ordering::SeqCst);
                        guard.unlock().unwrap();
                    }
                })
            })
            .collect();
        eventually(Duration::from_secs(10), "the stream of readers", || reads.load(Ordering::SeqCst) >= 20);

        let upgrader_client = deployment.client();
        let up = upgrader_client.rw_lock("up-stream").unwrap().upgradable_read().unwrap();
        let started = Instant::now();
        let write = up.try_upgrade_for(Duration::from_secs(10)).unwrap().expect("not starved");
        let waited = started.elapsed();
        assert_eq!(inside.load(Ordering::SeqCst), 0, "a reader is inside with the upgraded writer");
        let reads_before = reads.load(Ordering::SeqCst);
        write.unlock().unwrap();
        up.unlock().unwrap();
        println!("the upgrade got in after {waited:?} behind a stream of readers");
        assert!(waited < Duration::from_millis(1_500), "the upgrade waited {waited:?}");
        eventually(Duration::from_secs(10), "readers after the upgrade", || {
            reads.load(Ordering::SeqCst) >= reads_before + 8
        });
        stop.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.joined();
        }
    }
}

across_topologies! {
    but_masters;
    /// A thread waiting for the upgradable read behind a waiting writer
    /// (10 s parks) gets in at once when the writer gives up.
    fn a_writer_that_gives_up_lets_a_waiting_upgradable_reader_in_at_once(deployment) {
        let name = "writer-leaves";
        let holder = deployment.client();
        let held = holder.rw_lock(name).unwrap().read().unwrap();
        let writer_client = deployment.builder().max_park(Duration::from_secs(5)).build().unwrap();
        let writer = thread::spawn(move || {
            let lock = writer_client.rw_lock(name).unwrap();
            assert!(lock.try_write_for(Duration::from_secs(1)).unwrap().is_none(), "a reader holds");
            Instant::now()
        });
        let mut raw = deployment.server_for(&rw_key(name, "writers")).connection();
        eventually(Duration::from_secs(10), "the writer's place", || waiting_writers(&mut raw, name) == 1);
        let waiter_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let lock = waiter_client.rw_lock(name).unwrap();
        assert!(lock.try_upgradable_read().unwrap().is_none(), "it waits behind the writer");
        let waiter = thread::spawn(move || {
            let up = lock.try_upgradable_read_for(Duration::from_secs(20)).unwrap();
            (up.is_some(), Instant::now())
        });
        let gave_up_at = writer.joined();
        let (got, at) = waiter.joined();
        assert!(got);
        let late = at.saturating_duration_since(gave_up_at);
        assert!(late < Duration::from_millis(700), "got in {late:?} after the writer gave up");
        held.unlock().unwrap();
    }
}

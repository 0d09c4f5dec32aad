//! Every script declares in KEYS every key it reads or writes.
//!
//! Redis Cluster routes a script by its declared keys only, and refuses a
//! key the script did not declare while its slot migrates ("Script
//! attempted to access a non local key"); a key whose name a script builds
//! is invisible to routing. This binary checks it mechanically on a real
//! server: `MONITOR` shows each script call with its declared KEYS,
//! followed by every command the script ran (`[0 lua]` lines, which no
//! other client can interleave: a script runs atomically); the server's own
//! `COMMAND GETKEYS` says which arguments of each such command are keys;
//! every one of them must be among the call's declared keys. A scenario
//! drives every synchronizer through its contended paths (waiters woken,
//! places taken and left, undos, renewals), and the test also checks that
//! every script file under `src/scripts/` was run, so that a new script
//! is covered or listed here with the reason it is not.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, RateMode};
use testkit::{FaultProxy, RedisServer};

use crate::support::JoinWithin;

/// Scripts this test cannot reach, with the reason.
#[cfg(not(feature = "redlock"))]
const NOT_RUN_HERE: &[(&str, &str)] = &[
    (
        "lock/adopt_fence.lua",
        "sent only by a Redlock quorum of several masters (feature redlock)",
    ),
    (
        "lock/release_many.lua",
        "sent only by a Redlock quorum of several masters (feature redlock)",
    ),
];
#[cfg(feature = "redlock")]
const NOT_RUN_HERE: &[(&str, &str)] = &[];

/// Every line a `MONITOR` connection receives, collected by a thread.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                sink.lock().unwrap().push(line);
            }
        });
        Monitor { lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// One `MONITOR` line: who sent it (`lua` for a script's own commands) and
/// the command's words.
fn parse_line(line: &str) -> Option<(String, Vec<Vec<u8>>)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = line[open + 1..close].split_once(' ')?.1.to_owned();
    let mut words = Vec::new();
    let mut rest = line[close + 1..].trim_start().as_bytes();
    while let Some(start) = rest.iter().position(|&b| b == b'"') {
        rest = &rest[start + 1..];
        let mut word = Vec::new();
        let mut i = 0;
        while i < rest.len() && rest[i] != b'"' {
            if rest[i] == b'\\' && i + 1 < rest.len() {
                i += 1;
                match rest[i] {
                    b'n' => word.push(b'\n'),
                    b'r' => word.push(b'\r'),
                    b't' => word.push(b'\t'),
                    b'a' => word.push(7),
                    b'b' => word.push(8),
                    b'x' => {
                        let hex = std::str::from_utf8(&rest[i + 1..i + 3]).ok()?;
                        word.push(u8::from_str_radix(hex, 16).ok()?);
                        i += 2;
                    }
                    other => word.push(other),
                }
            } else {
                word.push(rest[i]);
            }
            i += 1;
        }
        words.push(word);
        rest = &rest[(i + 1).min(rest.len())..];
    }
    Some((source, words))
}

fn text(word: &[u8]) -> String {
    String::from_utf8_lossy(word).into_owned()
}

/// The script files (not the `lib/` helpers), by path under `src/scripts`,
/// with their source.
fn script_files() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
    let mut files = BTreeMap::new();
    for dir in std::fs::read_dir(&root).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() || dir.ends_with("lib") {
            continue;
        }
        for file in std::fs::read_dir(&dir).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "lua") {
                let name = file.strip_prefix(&root).unwrap().display().to_string();
                files.insert(name, std::fs::read_to_string(&file).unwrap());
            }
        }
    }
    files
}

/// What one script ran that it had not declared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Undeclared {
    script: String,
    command: String,
    key: String,
}

/// Reads the monitored lines: every key a script's commands touched that
/// its call did not declare, and the script files that ran.
fn check(lines: &[String], server: &RedisServer) -> (BTreeSet<Undeclared>, BTreeSet<String>) {
    let files = script_files();
    let mut con = server.connection();
    // Every source loaded, by its SHA (loading it again answers the SHA):
    // a first pass, since a call may come before its load (NOSCRIPT).
    let mut file_of_sha: HashMap<String, String> = HashMap::new();
    for (_, words) in lines.iter().filter_map(|line| parse_line(line)) {
        if words.len() == 3
            && text(&words[0]).eq_ignore_ascii_case("script")
            && text(&words[1]).eq_ignore_ascii_case("load")
        {
            let body = text(&words[2]);
            let file = files
                .iter()
                .find(|(_, content)| body.ends_with(content.as_str()))
                .map(|(name, _)| name.clone())
                .unwrap_or_else(|| "an unknown script".to_owned());
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&words[2])
                .query(&mut con)
                .unwrap();
            file_of_sha.insert(sha, file);
        }
    }
    let mut current: Option<(String, BTreeSet<Vec<u8>>)> = None;
    let mut undeclared = BTreeSet::new();
    let mut ran = BTreeSet::new();
    for line in lines {
        let Some((source, words)) = parse_line(line) else {
            continue;
        };
        let Some(command) = words.first().map(|w| text(w).to_lowercase()) else {
            continue;
        };
        if source == "lua" {
            let Some((script, declared)) = &current else {
                panic!("a script's command outside any script call: {line}");
            };
            let keys: Vec<Vec<u8>> = if words.len() == 1 {
                // TIME and the like: no arguments, so no key.
                Vec::new()
            } else {
                match redis::cmd("COMMAND")
                    .arg("GETKEYS")
                    .arg(&words)
                    .query(&mut con)
                {
                    Ok(keys) => keys,
                    // A command whose arguments hold no key.
                    Err(err) if err.to_string().contains("no key arguments") => Vec::new(),
                    Err(err) => panic!("COMMAND GETKEYS failed on {line}: {err}"),
                }
            };
            for key in keys {
                if !declared.contains(&key) {
                    undeclared.insert(Undeclared {
                        script: script.clone(),
                        command: command.to_uppercase(),
                        key: text(&key),
                    });
                }
            }
            continue;
        }
        current = None;
        if command != "evalsha" && command != "eval" {
            continue;
        }
        let (Some(first), Some(count)) = (words.get(1), words.get(2)) else {
            continue;
        };
        let script = if command == "eval" {
            let body = text(first);
            files
                .iter()
                .find(|(_, content)| body.ends_with(content.as_str()))
                .map(|(name, _)| name.clone())
                .unwrap_or_else(|| "an unknown script".to_owned())
        } else {
            let sha = text(first);
            file_of_sha.get(&sha).cloned().unwrap_or(sha)
        };
        let count: usize = text(count).parse().unwrap();
        let declared = words[3..3 + count].iter().cloned().collect();
        ran.insert(script.clone());
        current = Some((script, declared));
    }
    (undeclared, ran)
}

/// Runs every synchronizer through its contended paths on `server`;
/// returns what must live until the undos sent in the background ran.
fn scenario(server: &RedisServer) -> (Client, FaultProxy) {
    let client = Client::builder(server.url())
        .max_park(Duration::from_millis(200))
        .default_lease(Duration::from_millis(900))
        .build()
        .unwrap();
    let ms = Duration::from_millis;

    // Lock: re-entry, an inner release, a waiter woken by the baton, a
    // local hand-off, extend, holder, force_unlock, renewal.
    let lock = client.lock("keys-lock").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    inner.unlock().unwrap();
    outer.extend(Duration::from_secs(2)).unwrap();
    assert!(lock.holder().unwrap().is_some());
    // Waiters with a fixed lease: the renewed ownership is handed to them
    // by the hand-off script (one with the same lease would pass in
    // memory, running no script).
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let lock = lock.with_fixed_lease(Duration::from_secs(5)).unwrap();
            thread::spawn(move || {
                let guard = lock.try_lock_for(Duration::from_secs(10)).unwrap().unwrap();
                thread::sleep(ms(50));
                guard.unlock().unwrap();
            })
        })
        .collect();
    thread::sleep(ms(1_000)); // renewals, and the waiters park
    outer.unlock().unwrap();
    for waiter in waiters {
        waiter.joined();
    }
    let _held = lock.lock().unwrap();
    let other = lock.clone();
    let parked = thread::spawn(move || other.try_lock_for(ms(300)).unwrap().is_some());
    thread::sleep(ms(100));
    assert!(lock.force_unlock().unwrap());
    parked.joined();

    // A waiter of another client: granted the lock by a release, then one
    // that stops waiting and takes its grant off.
    let another = Client::builder(server.url()).build().unwrap();
    let held = client.lock("keys-grant").unwrap().lock().unwrap();
    let theirs = another.lock("keys-grant").unwrap();
    let granted = thread::spawn(move || {
        let guard = theirs.try_lock_for(Duration::from_secs(10)).unwrap();
        assert!(guard.is_some(), "granted");
        assert!(
            theirs.try_lock_for(ms(300)).unwrap().is_some(),
            "re-entered"
        );
    });
    let mut raw = server.connection();
    support::eventually(Duration::from_secs(10), "the waiter marked", || {
        redis::cmd("HEXISTS")
            .arg(support::lock_key("keys-grant"))
            .arg("grant")
            .query(&mut raw)
            .unwrap()
    });
    held.unlock().unwrap();
    granted.joined();
    let held = client.lock("keys-grant").unwrap().lock().unwrap();
    let theirs = another.lock("keys-grant").unwrap();
    assert!(theirs.try_lock_for(ms(300)).unwrap().is_none());
    held.unlock().unwrap();

    // Multi-lock: a set taken at once, re-entering a name this thread
    // holds, and a waiter that finds a name held, parks, and wins.
    let single = client.lock("keys-multi-b").unwrap().lock().unwrap();
    let set = client.multi_lock(["keys-multi-a", "keys-multi-b"]).unwrap();
    set.lock().unwrap().unlock().unwrap();
    let other = set.clone();
    let waiting = thread::spawn(move || {
        let guard = other
            .try_lock_for(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        guard.unlock().unwrap();
    });
    thread::sleep(ms(100));
    single.unlock().unwrap();
    waiting.joined();

    // Fair lock granted: the second of two waiters of other clients, found
    // next by the first's acquisition, is granted the lock by the first's
    // release (its grant spec, the fence, its place).
    let first = client.fair_lock("keys-fair-grant").unwrap().lock().unwrap();
    let published = |server: &RedisServer| server.command_calls().get("publish").copied();
    let before = published(server).unwrap_or(0);
    let granted: Vec<_> = (1..=2)
        .map(|queued| {
            let fair = Client::builder(server.url())
                .max_park(ms(30_000))
                .build()
                .unwrap()
                .fair_lock("keys-fair-grant")
                .unwrap();
            let waiter = thread::spawn(move || {
                let guard = fair.try_lock_for(Duration::from_secs(10)).unwrap().unwrap();
                guard.unlock().unwrap();
            });
            let fair = client.fair_lock("keys-fair-grant").unwrap();
            support::eventually(Duration::from_secs(10), "the waiter queued", || {
                fair.queued_waiters().unwrap() == queued
            });
            waiter
        })
        .collect();
    first.unlock().unwrap();
    for waiter in granted {
        waiter.joined();
    }
    assert!(published(server).unwrap_or(0) > before, "granted");

    // Fair lock: queued waiters woken one at a time (one of this client,
    // woken in memory, and one of another client, woken by a token the
    // release pushes to its list), one that gives up, force_unlock with
    // another client's waiter.
    let fair = client.fair_lock("keys-fair").unwrap();
    let held = fair.lock().unwrap();
    let inner = fair.lock().unwrap();
    inner.unlock().unwrap();
    let another = Client::builder(server.url())
        .max_park(Duration::from_millis(200))
        .build()
        .unwrap();
    let queued: Vec<_> = [fair.clone(), another.fair_lock("keys-fair").unwrap()]
        .into_iter()
        .map(|fair| {
            thread::spawn(move || {
                let guard = fair.try_lock_for(Duration::from_secs(10)).unwrap().unwrap();
                guard.unlock().unwrap();
            })
        })
        .collect();
    let other = fair.clone();
    let impatient = thread::spawn(move || other.try_lock_for(ms(300)).unwrap().is_some());
    assert!(!impatient.joined());
    thread::sleep(ms(1_000));
    held.unlock().unwrap();
    for waiter in queued {
        waiter.joined();
    }
    let _held = fair.lock().unwrap();
    // Another client's waiter: force_unlock names it, and its list is
    // pushed by a call of its own (fair/wake.lua).
    let other = another.fair_lock("keys-fair").unwrap();
    let parked = thread::spawn(move || {
        other
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .is_some()
    });
    thread::sleep(ms(300));
    assert!(fair.force_unlock().unwrap());
    assert!(parked.joined());
    // A hand-off to a parked thread of this client: a holder that took the
    // lock while that thread waited releases it. Under a fixed lease, by
    // the release's script (fair/handoff.lua); under a renewed one, in
    // memory, and the waiter's release drops the place it was served for.
    let scripted = fair.with_fixed_lease(ms(30_000)).unwrap();
    for fair in [&scripted, &fair] {
        let blocker = another.fair_lock("keys-fair").unwrap().lock().unwrap();
        let parked_before = support::parked(server);
        let (took, holder_took) = std::sync::mpsc::channel();
        let (go, holder_may_go) = std::sync::mpsc::channel::<()>();
        let holder = {
            let fair = fair.clone();
            thread::spawn(move || {
                let guard = fair.lock().unwrap();
                took.send(()).unwrap();
                holder_may_go.recv().unwrap();
                guard.unlock().unwrap();
            })
        };
        support::eventually(Duration::from_secs(10), "the holder queued", || {
            fair.queued_waiters().unwrap() == 1
        });
        let waiter = {
            let fair = fair.clone();
            thread::spawn(move || {
                let guard = fair.try_lock_for(Duration::from_secs(10)).unwrap().unwrap();
                guard.unlock().unwrap();
            })
        };
        support::eventually(Duration::from_secs(10), "both parked", || {
            fair.queued_waiters().unwrap() == 2 && support::parked(server) >= parked_before + 2
        });
        blocker.unlock().unwrap();
        holder_took.recv_timeout(Duration::from_secs(10)).unwrap();
        go.send(()).unwrap();
        holder.joined();
        waiter.joined();
        assert_eq!(fair.queued_waiters().unwrap(), 0);
    }

    // Read-write lock: readers, a writer waiting behind them, readers
    // waiting behind a writer, a writer that gives up, renewals.
    let rw = client.rw_lock("keys-rw").unwrap();
    let read = rw.read().unwrap();
    let read_again = rw.read().unwrap();
    let other = rw.clone();
    let gives_up = thread::spawn(move || other.try_write_for(ms(300)).unwrap().is_some());
    assert!(!gives_up.joined());
    let other = rw.clone();
    let writer = thread::spawn(move || {
        let guard = other
            .try_write_for(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        thread::sleep(ms(300));
        guard.unlock().unwrap();
    });
    thread::sleep(ms(800));
    read_again.unlock().unwrap();
    read.unlock().unwrap();
    thread::sleep(ms(100));
    let other = rw.clone();
    let reader = thread::spawn(move || {
        other
            .try_read_for(Duration::from_secs(10))
            .unwrap()
            .unwrap()
            .unlock()
            .unwrap()
    });
    writer.joined();
    reader.joined();

    // Upgradable read: taken and re-entered; a thread waiting for it is
    // woken by its release; an upgrade that gives up takes its mark off,
    // one that waits for a reader is woken by the reader's release.
    let rw = client.rw_lock("keys-rw-up").unwrap();
    let up = rw.upgradable_read().unwrap();
    rw.upgradable_read().unwrap().unlock().unwrap();
    let other = rw.clone();
    let waiting = thread::spawn(move || {
        other
            .try_upgradable_read_for(Duration::from_secs(10))
            .unwrap()
            .unwrap()
            .unlock()
            .unwrap()
    });
    let other = rw.clone();
    let (reading, read_taken) = std::sync::mpsc::channel();
    let reader = thread::spawn(move || {
        let read = other.read().unwrap();
        reading.send(()).unwrap();
        thread::sleep(ms(800));
        read.unlock().unwrap();
    });
    read_taken.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(up.try_upgrade_for(ms(200)).unwrap().is_none());
    let write = up
        .try_upgrade_for(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    write.unlock().unwrap();
    reader.joined();
    up.unlock().unwrap();
    waiting.joined();

    // Semaphore: total set and adjusted, a waiter woken by a release,
    // renewals, state.
    let sem = client.semaphore("keys-sem").unwrap();
    sem.try_set_permits(1).unwrap();
    sem.add_permits(1).unwrap();
    sem.reduce_permits(1).unwrap();
    let permit = sem.acquire().unwrap();
    let other = sem.clone();
    let waiter = thread::spawn(move || {
        other
            .try_acquire_for(Duration::from_secs(10))
            .unwrap()
            .unwrap()
            .release()
            .unwrap()
    });
    thread::sleep(ms(800));
    assert_eq!(sem.available_permits().unwrap(), 0);
    permit.release().unwrap();
    waiter.joined();
    sem.total_permits().unwrap();

    // Latch: a waiter parked until the count reaches zero.
    let latch = client.count_down_latch("keys-latch").unwrap();
    assert!(latch.try_set_count(1).unwrap());
    let other = latch.clone();
    let waiter = thread::spawn(move || other.wait_for(Duration::from_secs(10)).unwrap());
    thread::sleep(ms(200));
    latch.count_down().unwrap();
    assert!(waiter.joined());
    latch.count().unwrap();

    // Rate limiter.
    let limiter = client.rate_limiter("keys-rate").unwrap();
    limiter
        .set_rate(RateMode::Overall, 10, Duration::from_secs(1))
        .unwrap();
    limiter
        .force_rate(RateMode::Overall, 10, Duration::from_secs(1))
        .unwrap();
    assert!(limiter.try_acquire(1).unwrap());
    limiter.available_permits().unwrap();

    // Undos: with a replica to confirm that does not exist, every write
    // that creates an ownership is undone at once (lock, fair lock, both
    // holds of the read-write lock, a permit).
    let undoing = Client::builder(server.url())
        .replica_acks(1, ms(20))
        .max_park(ms(200))
        .build()
        .unwrap();
    assert!(undoing.lock("keys-lock-undo").unwrap().try_lock().is_err());
    assert!(undoing
        .fair_lock("keys-fair-undo")
        .unwrap()
        .try_lock()
        .is_err());
    let rw = undoing.rw_lock("keys-rw-undo").unwrap();
    let _ = rw.try_read();
    let _ = rw.try_write();
    let _ = rw.try_upgradable_read();
    let sem = undoing.semaphore("keys-sem-undo").unwrap();
    let _ = sem.try_set_permits(1);
    let _ = sem.try_acquire();

    // The read-write lock undoes a request whose outcome is unknown (its
    // request swallowed by a silent peer) once the server answers again.
    let proxy = FaultProxy::start(server.port());
    let through = Client::builder(proxy.url())
        .io_timeout(ms(300))
        .build()
        .unwrap();
    let rw = through.rw_lock("keys-rw-lost").unwrap();
    rw.try_read().unwrap().unwrap().unlock().unwrap();
    proxy.set_silent(true);
    assert!(rw.try_read().is_err());
    proxy.set_silent(false);
    (through, proxy)
}

/// A Redlock quorum's rounds on `masters` (its second round proposes a
/// common fencing token: `adopt_fence`).
#[cfg(feature = "redlock")]
fn quorum_scenario(masters: &[RedisServer]) {
    let client = Client::builder(redbaton::Topology::masters(
        masters.iter().map(RedisServer::url),
    ))
    .build()
    .unwrap();
    // One master's counter far ahead: the masters issue different tokens,
    // and a second round proposes one to all.
    redis::cmd("SET")
        .arg("redbaton:{keys-quorum}:fence")
        .arg(8_000_000_000_000_000u64)
        .query::<()>(&mut masters[0].connection())
        .unwrap();
    let lock = client.lock("keys-quorum").unwrap();
    let guard = lock.lock().unwrap();
    assert!(lock.holder().unwrap().is_some());
    guard.unlock().unwrap();
    // A multi-lock's set in one round each way; another client finds a
    // name held, so that its release pushes a baton.
    let set = client
        .multi_lock(["keys-quorum-a", "keys-quorum-b"])
        .unwrap();
    let guard = set.lock().unwrap();
    let other = Client::builder(redbaton::Topology::masters(
        masters.iter().map(RedisServer::url),
    ))
    .build()
    .unwrap();
    assert!(other
        .lock("keys-quorum-b")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_none());
    guard.unlock().unwrap();
}

#[test]
fn every_script_declares_every_key_it_touches() {
    let server = RedisServer::start();
    // The quorum's masters are monitored too, with the redlock feature.
    #[cfg_attr(not(feature = "redlock"), allow(unused_mut))]
    let mut monitored = vec![(Monitor::start(&server), &server)];
    let _background = scenario(&server);
    #[cfg(feature = "redlock")]
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    #[cfg(feature = "redlock")]
    {
        monitored.extend(masters.iter().map(|m| (Monitor::start(m), m)));
        quorum_scenario(&masters);
    }
    // Undos run in the background; the monitors' threads read on.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (undeclared, ran, not_run) = loop {
        let mut undeclared = BTreeSet::new();
        let mut ran = BTreeSet::new();
        for (monitor, server) in &monitored {
            let (more_undeclared, more_ran) = check(&monitor.lines(), server);
            undeclared.extend(more_undeclared);
            ran.extend(more_ran);
        }
        let not_run: Vec<String> = script_files()
            .into_keys()
            .filter(|file| !ran.contains(file))
            .filter(|file| !NOT_RUN_HERE.iter().any(|(skip, _)| skip == file))
            .collect();
        if not_run.is_empty() || Instant::now() > deadline {
            break (undeclared, ran, not_run);
        }
        thread::sleep(Duration::from_millis(200));
    };
    println!("scripts run: {ran:?}");
    assert!(
        undeclared.is_empty(),
        "keys touched but not declared in KEYS:\n{}",
        undeclared
            .iter()
            .map(|u| format!("  {}: {} {}", u.script, u.command, u.key))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        not_run.is_empty(),
        "scripts the scenario never ran (cover them, or list them in NOT_RUN_HERE with the reason): {not_run:?}"
    );
}

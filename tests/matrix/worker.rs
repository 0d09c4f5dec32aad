//! The child processes of a cell: workers that enter and leave in a loop
//! until the witness says stop, and the victims an event kills or stops.
//! Each prints what it saw as `RESULT`/`ERROR` lines for the driver.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::spec::Spec;
use crate::subject::{kind, Handle};
use crate::support::JoinWithin;

/// This binary's child-process roles; false for another's.
pub(crate) fn run_child(role: &str, text: &str) -> bool {
    let spec = Spec::decode(text);
    FileLog::install(role);
    match role {
        "work" => work(&spec),
        "hold" => hold(&spec),
        "wait" => wait(&spec),
        _ => return false,
    }
    true
}

/// With `MATRIX_LOG=dir` set, each child writes the crate's log records
/// (debug and up, with a millisecond timestamp) to `dir/<role>-<pid>.log`:
/// a cell that fails can be read after the fact.
struct FileLog(std::sync::Mutex<std::fs::File>);

impl FileLog {
    fn install(role: &str) {
        let Some(dir) = std::env::var_os("MATRIX_LOG") else {
            return;
        };
        let path = std::path::Path::new(&dir).join(format!("{role}-{}.log", std::process::id()));
        let file = std::fs::File::create(path).expect("the MATRIX_LOG file");
        let logger = Box::leak(Box::new(FileLog(std::sync::Mutex::new(file))));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    }
}

impl log::Log for FileLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        use std::io::Write;
        let thread = thread::current();
        let line = format!(
            "{} {:?} {} {}\n",
            now_ms(),
            thread.name().unwrap_or("-"),
            record.level(),
            record.args()
        );
        let _ = self.0.lock().unwrap().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// No worker runs longer than this, whatever the driver does.
const WORKER_CAP: Duration = Duration::from_secs(90);
/// An entry that waits this long is counted as a timeout.
pub const ENTRY_TIMEOUT: Duration = Duration::from_secs(20);

/// Milliseconds since the epoch: comparable across the cell's processes.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What one worker thread saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub entries: u64,
    pub overlaps: u64,
    pub timeouts: u64,
    pub max_wait: u64,
    /// The longest time from the last leave (of anyone) to an entry: how
    /// long the synchronizer stayed shut with waiters at its door.
    pub max_gap: u64,
    /// Error kind → (count, transient, an example).
    pub errors: BTreeMap<String, (u64, bool, String)>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.entries += other.entries;
        self.overlaps += other.overlaps;
        self.timeouts += other.timeouts;
        self.max_wait = self.max_wait.max(other.max_wait);
        self.max_gap = self.max_gap.max(other.max_gap);
        for (kind, (count, transient, example)) in other.errors {
            let entry = self.errors.entry(kind).or_insert((0, transient, example));
            entry.0 += count;
        }
    }

    fn error(&mut self, error: &redbaton::Error) {
        let entry =
            self.errors
                .entry(kind(error))
                .or_insert((0, error.is_transient(), format!("{error}")));
        entry.0 += 1;
    }

    /// The lines the driver parses.
    pub fn print(&self) {
        for (kind, (count, transient, example)) in &self.errors {
            println!(
                "ERROR {kind} {count} {} {}",
                u8::from(*transient),
                example.replace('\n', " ")
            );
        }
        println!(
            "RESULT {} {} {} {} {}",
            self.entries, self.overlaps, self.timeouts, self.max_wait, self.max_gap
        );
    }

    /// Parses the lines of [`Tally::print`] into one tally.
    pub fn parse(results: &[String], errors: &[String]) -> Tally {
        let mut tally = Tally::default();
        for line in results {
            let n: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
            tally.add(Tally {
                entries: n[0],
                overlaps: n[1],
                timeouts: n[2],
                max_wait: n[3],
                max_gap: n[4],
                errors: BTreeMap::new(),
            });
        }
        for line in errors {
            let mut parts = line.splitn(4, ' ');
            let kind = parts.next().unwrap().to_owned();
            let count: u64 = parts.next().unwrap().parse().unwrap();
            let transient = parts.next().unwrap() == "1";
            let example = parts.next().unwrap_or("").to_owned();
            let entry = tally.errors.entry(kind).or_insert((0, transient, example));
            entry.0 += count;
        }
        tally
    }
}

/// Whether the driver said stop.
fn stopped(witness: &mut redis::Connection) -> bool {
    redis::cmd("EXISTS").arg("stop").query(witness).unwrap()
}

/// `spec.threads` threads enter and leave until told to stop.
fn work(spec: &Spec) {
    let client = spec.client();
    let handle = Handle::new(spec, &client);
    let mut witness = spec.witness();
    println!("READY");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !redis::cmd("EXISTS")
        .arg("go")
        .query::<bool>(&mut witness)
        .unwrap()
    {
        assert!(Instant::now() < deadline, "no go within 30 s");
        thread::sleep(Duration::from_millis(2));
    }
    let mut total = Tally::default();
    thread::scope(|scope| {
        let threads: Vec<_> = (0..spec.threads)
            .map(|index| {
                let handle = &handle;
                scope.spawn(move || work_thread(spec, handle, index))
            })
            .collect();
        for thread in threads {
            total.add(thread.joined());
        }
    });
    total.print();
}

fn work_thread(spec: &Spec, handle: &Handle, index: usize) -> Tally {
    let mut witness = spec.witness();
    let mut tally = Tally::default();
    let started = Instant::now();
    while !stopped(&mut witness) && started.elapsed() < WORKER_CAP {
        let asked = Instant::now();
        let held = match handle.enter(index, ENTRY_TIMEOUT) {
            Ok(Some(held)) => held,
            Ok(None) => {
                log::info!("thread {index}: timed out");
                tally.timeouts += 1;
                continue;
            }
            Err(error) => {
                log::info!("thread {index}: enter failed: {error}");
                tally.error(&error);
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        tally.entries += 1;
        log::info!(
            "thread {index}: entered after {} ms",
            asked.elapsed().as_millis()
        );
        tally.max_wait = tally.max_wait.max(asked.elapsed().as_millis() as u64);
        let last_exit: Option<u64> = redis::cmd("GET")
            .arg("last_exit")
            .query(&mut witness)
            .unwrap();
        if let Some(last_exit) = last_exit {
            tally.max_gap = tally.max_gap.max(now_ms().saturating_sub(last_exit));
        }
        let marked = held.mark(&mut witness, spec.cap);
        if !marked {
            tally.overlaps += 1;
        }
        thread::sleep(spec.hold);
        held.unmark(&mut witness, marked);
        log::info!("thread {index}: leaving");
        if let Err(error) = held.leave() {
            log::info!("thread {index}: leave failed: {error}");
            tally.error(&error);
        }
        redis::cmd("SET")
            .arg("last_exit")
            .arg(now_ms())
            .query::<()>(&mut witness)
            .unwrap();
    }
    tally
}

/// A victim holder: takes everything (the lock, a write hold, every
/// permit), says `HELD`, and keeps it until killed, or, once stopped and
/// continued past its lease, reports whether it learned it lost it.
fn hold(spec: &Spec) {
    let client = spec.client();
    let handle = Handle::new(spec, &client);
    let held = handle
        .enter_all(spec.permits, ENTRY_TIMEOUT)
        .unwrap()
        .expect("the victim got everything within 20 s");
    println!("HELD");
    let mut witness = spec.witness();
    let deadline = Instant::now() + WORKER_CAP;
    while !redis::cmd("EXISTS")
        .arg("victim-release")
        .query::<bool>(&mut witness)
        .unwrap()
    {
        assert!(Instant::now() < deadline, "nobody ended the victim");
        thread::sleep(Duration::from_millis(10));
    }
    let lost = held.is_lost();
    let release = match held.leave() {
        Ok(()) => "ok".to_owned(),
        Err(error) if error.is_lost() => "lost".to_owned(),
        Err(error) => format!("{error:?}").replace('\n', " "),
    };
    println!("AFTER {} {release}", u8::from(lost));
}

/// A victim waiter: says `WAITING` and waits (behind the test's own hold)
/// until killed.
fn wait(spec: &Spec) {
    let client = spec.client();
    let handle = Handle::new(spec, &client);
    println!("WAITING");
    if let Handle::Latch(latch) = &handle {
        let _ = latch.wait_for(ENTRY_TIMEOUT);
        return;
    }
    if let Ok(Some(held)) = handle.enter(1, ENTRY_TIMEOUT) {
        println!("ENTERED");
        let _ = held.leave();
    }
}

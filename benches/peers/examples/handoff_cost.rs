//! What a hand-off of the plain lock to a waiter of another client costs,
//! parked the usual way (the client's parking hub: `hub`, granted the lock
//! by the release where it can be), parked on the hub without grants
//! (`woken`: a user whose ACL refuses the grant channel, so that the
//! release's announcement wakes the waiter to take the lock itself), and
//! parked in `BLPOP` (a user whose ACL refuses `CLIENT TRACKING`, so that
//! the hub turns itself off), on a private server, over the `PING` of the
//! same run.
//!
//!     cargo run --release --manifest-path benches/peers/Cargo.toml --example handoff_cost
//!
//! `HANDOFF_COST_KIND=fair`, `=semaphore`, `=read` (a read behind a
//! write) or `=write` (a write behind a write) hands off another
//! synchronizer than the plain lock.
//!
//! (`REDIS_URL`: a server of your own, given without a user, where the
//! bench may run `ACL SETUSER no-tracking`.)
//!
//! Each round measures the floor of a hand-off by grant too, with no lock:
//! a `PUBLISH`, read by a subscriber thread that hands it to a waiting
//! thread. Each way's line gives its hand-off over the `PING` and over
//! that floor, both of the same rounds.
//!
//! Each round: the holder takes the lock, tells the waiter's thread to
//! ask, gives it 5 ms to park, sends one `PING` (timed), then releases;
//! the hand-off is the time from just before the release to just after
//! the waiter's acquisition returned, median of `ROUNDS`; 5 ms later, one
//! round of the floor. Both clients
//! live in this process, each with its own connections and hub, as two
//! processes would have.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const ROUNDS: usize = 200;
/// Runs of each way of parking, interleaved.
const RUNS: usize = 3;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// What is handed off: the plain lock, the fair lock, a semaphore's one
/// permit, or the read-write lock (the holder writes, the waiter reads or
/// writes).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Lock,
    Fair,
    Permit,
    Read,
    Write,
}

impl Kind {
    fn parse(s: &str) -> Kind {
        match s {
            "fair" => Kind::Fair,
            "semaphore" => Kind::Permit,
            "read" => Kind::Read,
            "write" => Kind::Write,
            _ => Kind::Lock,
        }
    }
}

/// One side's handle on the object of `kind`, named `name`.
enum Handle {
    Lock(redbaton::Lock),
    Permit(redbaton::Semaphore),
    /// The read-write lock, whose waiter reads.
    Rw(redbaton::RwLock),
    /// The read-write lock, whose waiter writes too.
    Writes(redbaton::RwLock),
}

/// A hold of a [`Handle`], let go when dropped.
enum Held {
    Lock(redbaton::LockGuard),
    Permit(redbaton::SemaphorePermit),
    Write(redbaton::WriteGuard),
    Read(redbaton::ReadGuard),
}

impl Handle {
    fn new(client: &redbaton::Client, kind: Kind, name: &str) -> Handle {
        match kind {
            Kind::Lock => Handle::Lock(client.lock(name).expect("name")),
            Kind::Fair => Handle::Lock(client.fair_lock(name).expect("name")),
            Kind::Permit => {
                let semaphore = client.semaphore(name).expect("name");
                semaphore.try_set_permits(1).expect("permits");
                Handle::Permit(semaphore)
            }
            Kind::Read => Handle::Rw(client.rw_lock(name).expect("name")),
            Kind::Write => Handle::Writes(client.rw_lock(name).expect("name")),
        }
    }

    /// Takes it: the read-write lock for writing when `holder`, else for
    /// reading.
    fn take(&self, holder: bool) -> Held {
        match self {
            Handle::Lock(lock) => Held::Lock(lock.lock().expect("lock")),
            Handle::Permit(semaphore) => Held::Permit(semaphore.acquire().expect("acquire")),
            Handle::Rw(rw) if holder => Held::Write(rw.write().expect("write")),
            Handle::Rw(rw) => Held::Read(rw.read().expect("read")),
            Handle::Writes(rw) => Held::Write(rw.write().expect("write")),
        }
    }
}

impl Held {
    fn give(self) {
        match self {
            Held::Lock(guard) => guard.unlock().expect("unlock"),
            Held::Permit(permit) => permit.release().expect("release"),
            Held::Write(guard) => guard.unlock().expect("unlock"),
            Held::Read(guard) => guard.unlock().expect("unlock"),
        }
    }
}

/// The medians of one way's `ROUNDS` rounds.
struct Medians {
    handoff: Duration,
    /// The floor's hand-off (see [`Floor`]), one in each round.
    floor: Duration,
    ping: Duration,
}

/// The hand-offs of `kind` between two clients connecting to `url`, and
/// the floor's, measured in the same rounds.
fn handoffs(kind: Kind, label: &str, url: &str, floor_url: &str) -> Medians {
    let holder = redbaton::Client::open(url).expect("holder");
    let waiting = redbaton::Client::open(url).expect("waiter");
    let name = format!("bench:handoff-cost:{kind:?}:{label}");
    let (ask, asked) = mpsc::channel::<()>();
    let (took, taken) = mpsc::channel::<Instant>();
    let handle = Handle::new(&holder, kind, &name);
    let waiter = thread::spawn(move || {
        let handle = Handle::new(&waiting, kind, &name);
        for () in asked {
            let held = handle.take(false);
            let at = Instant::now();

            held.give();
            took.send(at).expect("the holder waits");
        }
    });
    let mut raw = redis::Client::open(floor_url)
        .and_then(|client| client.get_connection())
        .expect("connect");
    let floor = Floor::start(floor_url, &format!("bench:handoff-cost:floor:{label}"));
    let (mut times, mut floors, mut pings) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let held = handle.take(true);
        ask.send(()).expect("the waiter listens");
        thread::sleep(Duration::from_millis(5));
        let ping = Instant::now();
        redis::cmd("PING").query::<String>(&mut raw).expect("PING");
        pings.push(ping.elapsed());
        let released = Instant::now();
        held.give();
        times.push(taken.recv().expect("the waiter took it") - released);
        thread::sleep(Duration::from_millis(5));
        floors.push(floor.round(&mut raw));
    }
    drop(ask);
    waiter.join().expect("the waiter's thread");
    floor.stop(&mut raw);
    Medians {
        handoff: median(times),
        floor: median(floors),
        ping: median(pings),
    }
}

/// The floor of a hand-off by grant, with no lock at all: a `PUBLISH`
/// (its reply awaited, as a release's is), read by a subscriber thread
/// that hands it to a thread waiting for it (as a hub's listener hands a
/// grant to its parked waiter). Its rounds run between the hand-offs'
/// rounds, so that both see the machine alike (how busy it is moves the
/// round trip by as much as three times on a small shared one).
struct Floor {
    channel: String,
    listener: thread::JoinHandle<()>,
    waiter: thread::JoinHandle<()>,
    taken: mpsc::Receiver<Instant>,
}

impl Floor {
    /// Subscribes its listener to `channel` on `url`, and starts its waiter.
    fn start(url: &str, channel: &str) -> Floor {
        let mut subscriber = redis::Client::open(url)
            .and_then(|client| client.get_connection())
            .expect("connect");
        let (heard, hear) = mpsc::channel::<()>();
        let (took, taken) = mpsc::channel::<Instant>();
        let (subscribed, ready) = mpsc::channel::<()>();
        let listened = channel.to_owned();
        let listener = thread::spawn(move || {
            let mut pubsub = subscriber.as_pubsub();
            pubsub.subscribe(&listened).expect("subscribe");
            subscribed.send(()).expect("the holder waits");
            // "stop" ends it.
            while pubsub
                .get_message()
                .expect("a message")
                .get_payload::<String>()
                .is_ok_and(|payload| payload != "stop")
            {
                heard.send(()).expect("the waiter listens");
            }
        });
        let waiter = thread::spawn(move || {
            for () in hear {
                took.send(Instant::now()).expect("the holder waits");
            }
        });
        ready.recv().expect("subscribed");
        Floor {
            channel: channel.to_owned(),
            listener,
            waiter,
            taken,
        }
    }

    /// One hand-off: from just before the `PUBLISH` to just after the
    /// waiter got it.
    fn round(&self, conn: &mut redis::Connection) -> Duration {
        let published = Instant::now();
        redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg("granted")
            .query::<i64>(conn)
            .expect("PUBLISH");
        self.taken.recv().expect("the waiter took it") - published
    }

    fn stop(self, conn: &mut redis::Connection) {
        redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg("stop")
            .query::<i64>(conn)
            .expect("PUBLISH");
        self.listener.join().expect("the listener's thread");
        self.waiter.join().expect("the waiter's thread");
    }
}

fn main() {
    let redis = testkit::DemoRedis::from_env().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(1)
    });
    let url = redis.url.clone();
    let mut admin = redis::Client::open(url.as_str())
        .and_then(|client| client.get_connection())
        .expect("connect");
    // The same rights, but no tracking: each waiter parks in BLPOP.
    let blpop_url = testkit::untracked_user(&mut admin, &url);
    // The hub, without the grant channel: each waiter is woken to take the
    // lock itself.
    let ungranted_url = testkit::ungranted_user(&mut admin, &url);
    let kind = Kind::parse(&std::env::var("HANDOFF_COST_KIND").unwrap_or_default());
    for _ in 0..RUNS {
        let ways = [
            ("hub", url.as_str()),
            ("woken", ungranted_url.as_str()),
            ("blpop", blpop_url.as_str()),
        ];
        for (label, url) in ways {
            let m = handoffs(kind, label, url, &redis.url);
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{kind:?} {label:<6} hand-off p50 {:>6.1} µs = {:.2} × PING, {:.2} × the floor \
                 (PUBLISH → listener → waiter {:>6.1} µs = {:.2} × PING; PING {:>5.1} µs)",
                us(m.handoff),
                m.handoff.as_secs_f64() / m.ping.as_secs_f64(),
                m.handoff.as_secs_f64() / m.floor.as_secs_f64(),
                us(m.floor),
                m.floor.as_secs_f64() / m.ping.as_secs_f64(),
                us(m.ping),
            );
        }
    }
}

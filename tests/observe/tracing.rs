//! `ClientBuilder::tracing`: the `tracing` events and spans a client
//! makes, seen by a small subscriber set for the test's threads only
//! (`with_default`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::support::{baton_key, eventually, lock_key};

/// One `tracing` event: its target, level and fields (`message` too), as
/// text, and the span it was told in.
#[derive(Debug, Clone)]
struct Seen {
    target: String,
    level: Level,
    fields: BTreeMap<String, String>,
    /// The id of the span current on its thread.
    span: Option<u64>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// One span: its name, target, level and fields as recorded so far, and
/// whether it closed (its last handle dropped).
#[derive(Debug, Clone)]
struct SpanSeen {
    id: u64,
    name: String,
    target: String,
    level: Level,
    fields: BTreeMap<String, String>,
    handles: usize,
    closed: bool,
}

impl SpanSeen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Kept {
    events: Vec<Seen>,
    spans: Vec<SpanSeen>,
    /// The spans each thread is in, innermost last.
    entered: HashMap<ThreadId, Vec<u64>>,
}

/// Keeps every event and span.
#[derive(Clone, Default)]
struct Keeper(Arc<Mutex<Kept>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Keeper {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut fields = BTreeMap::new();
        attributes.record(&mut Fields(&mut fields));
        let mut kept = self.0.lock().unwrap();
        let id = kept.spans.len() as u64 + 1;
        let metadata = attributes.metadata();
        kept.spans.push(SpanSeen {
            id,
            name: metadata.name().to_owned(),
            target: metadata.target().to_owned(),
            level: *metadata.level(),
            fields,
            handles: 1,
            closed: false,
        });
        Id::from_u64(id)
    }

    fn record(&self, id: &Id, values: &Record<'_>) {
        let mut kept = self.0.lock().unwrap();
        let span = &mut kept.spans[id.into_u64() as usize - 1];
        values.record(&mut Fields(&mut span.fields));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let mut kept = self.0.lock().unwrap();
        let span = kept
            .entered
            .get(&thread::current().id())
            .and_then(|entered| entered.last().copied());
        kept.events.push(Seen {
            target: event.metadata().target().to_owned(),
            level: *event.metadata().level(),
            fields,
            span,
        });
    }

    fn enter(&self, id: &Id) {
        let mut kept = self.0.lock().unwrap();
        kept.entered
            .entry(thread::current().id())
            .or_default()
            .push(id.into_u64());
    }

    fn exit(&self, id: &Id) {
        let mut kept = self.0.lock().unwrap();
        let entered = kept.entered.entry(thread::current().id()).or_default();
        assert_eq!(entered.pop(), Some(id.into_u64()), "spans exited in order");
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.0.lock().unwrap().spans[id.into_u64() as usize - 1].handles += 1;
        id.clone()
    }

    fn try_close(&self, id: Id) -> bool {
        let mut kept = self.0.lock().unwrap();
        let span = &mut kept.spans[id.into_u64() as usize - 1];
        span.handles -= 1;
        span.closed = span.handles == 0;
        span.closed
    }
}

impl Keeper {
    /// The events of target `redbaton`.
    fn seen(&self) -> Vec<Seen> {
        let kept = self.0.lock().unwrap();
        kept.events
            .iter()
            .filter(|s| s.target == "redbaton")
            .cloned()
            .collect()
    }

    /// Every span made so far.
    fn spans(&self) -> Vec<SpanSeen> {
        self.0.lock().unwrap().spans.clone()
    }
}

fn traced(server: &RedisServer) -> Client {
    Client::builder(server.url()).tracing().build().unwrap()
}

#[test]
fn a_cycle_is_told_as_an_acquisition_and_a_release_with_their_fields() {
    let server = RedisServer::start();
    let keeper = Keeper::default();
    let token = tracing::subscriber::with_default(keeper.clone(), || {
        let client = traced(&server);
        let guard = client.lock("plain").unwrap().lock().unwrap();
        let token = guard.fencing_token();
        guard.unlock().unwrap();
        token
    });
    let seen = keeper.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (acquired, released) = (&seen[0], &seen[1]);
    assert_eq!(acquired.level, Level::DEBUG);
    assert_eq!(acquired.field("message"), Some("acquired"));
    assert_eq!(acquired.field("name"), Some("plain"));
    assert_eq!(acquired.field("kind"), Some("lock"));
    assert_eq!(acquired.field("how"), Some("first_attempt"));
    assert_eq!(
        acquired.field("fencing_token"),
        Some(token.to_string().as_str())
    );
    assert!(acquired.field("waited").is_some(), "{acquired:?}");
    assert_eq!(released.level, Level::DEBUG);
    assert_eq!(released.field("message"), Some("released"));
    assert_eq!(released.field("name"), Some("plain"));
    assert_eq!(released.field("kind"), Some("lock"));
    assert!(released.field("held").is_some(), "{released:?}");
}

#[test]
fn a_loss_is_a_warning_with_its_reason_and_a_timeout_is_told() {
    let server = RedisServer::start();
    let keeper = Keeper::default();
    tracing::subscriber::with_default(keeper.clone(), || {
        let client = traced(&server);
        let lock = client.lock("lost").unwrap();
        let guard = lock.lock().unwrap();
        let other = Client::open(&server.url()).unwrap();
        let other_lock = other.lock("lost").unwrap();
        // Not this client's: no event.
        assert!(other_lock
            .try_lock_for(Duration::from_millis(50))
            .unwrap()
            .is_none());
        let _: i64 = redis::cmd("DEL")
            .arg(lock_key("lost"))
            .query(&mut server.connection())
            .unwrap();
        let held = other_lock.lock().unwrap();
        assert!(guard.unlock().is_err());
        assert!(lock
            .try_lock_for(Duration::from_millis(200))
            .unwrap()
            .is_none());
        held.unlock().unwrap();
    });
    let seen = keeper.seen();
    let messages: Vec<&str> = seen.iter().filter_map(|s| s.field("message")).collect();
    assert_eq!(
        messages,
        [
            "acquired",
            "lost: Redis says it is no longer this thread's",
            "parked",
            "woken",
            "timed out"
        ]
    );
    let lost = &seen[1];
    assert_eq!(lost.level, Level::WARN);
    assert_eq!(lost.field("name"), Some("lost"));
    assert_eq!(lost.field("kind"), Some("lock"));
    assert_eq!(lost.field("reason"), Some("not_held"));
    let timed_out = &seen[4];
    assert_eq!(timed_out.level, Level::INFO);
    assert_eq!(timed_out.field("name"), Some("lost"));
    assert!(timed_out.field("waited").is_some(), "{timed_out:?}");
}

/// A span's `waited_ms`, as recorded.
fn waited_ms(span: &SpanSeen) -> f64 {
    span.field("waited_ms")
        .unwrap_or_else(|| panic!("no waited_ms: {span:?}"))
        .parse()
        .unwrap()
}

#[test]
fn every_acquisition_is_one_span_with_its_outcome() {
    let server = RedisServer::start();
    let keeper = Keeper::default();
    let client = traced(&server);
    // Untraced: what it holds makes no span.
    let other = Client::open(&server.url()).unwrap();

    // Contended: a thread of the traced client waits until `other`
    // releases, at least `HELD_ON` after the waiter parked.
    const HELD_ON: Duration = Duration::from_millis(200);
    let busy = other.lock("busy").unwrap().lock().unwrap();
    let waiter = {
        let (keeper, client) = (keeper.clone(), client.clone());
        thread::spawn(move || {
            tracing::subscriber::with_default(keeper, || {
                let guard = client.lock("busy").unwrap().lock().unwrap();
                let token = guard.fencing_token();
                guard.unlock().unwrap();
                token
            })
        })
    };
    eventually(Duration::from_secs(10), "the waiter parked", || {
        keeper
            .seen()
            .iter()
            .any(|seen| seen.field("message") == Some("parked"))
    });
    thread::sleep(HELD_ON);
    busy.unlock().unwrap();
    let contended_token = waiter.join().unwrap();

    // Failed while waiting: the key of the lock waited for is replaced by
    // a string, and the waiter woken to find it.
    let broken = other.lock("broken").unwrap().lock().unwrap();
    let waiter = {
        let (keeper, client) = (keeper.clone(), client.clone());
        thread::spawn(move || {
            tracing::subscriber::with_default(keeper, || {
                client.lock("broken").unwrap().lock().is_err()
            })
        })
    };
    eventually(Duration::from_secs(10), "the second waiter parked", || {
        keeper.seen().iter().any(|seen| {
            seen.field("message") == Some("parked") && seen.field("name") == Some("broken")
        })
    });
    let mut connection = server.connection();
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(lock_key("broken"))
        .arg("x")
        .ignore()
        .cmd("RPUSH")
        .arg(baton_key("broken"))
        .arg("ok")
        .ignore()
        .query(&mut connection)
        .unwrap();
    assert!(waiter.join().unwrap(), "the wait failed");
    drop(broken);

    let free_token = tracing::subscriber::with_default(keeper.clone(), || {
        // Uncontended.
        let guard = client.lock("free").unwrap().lock().unwrap();
        let token = guard.fencing_token();
        guard.unlock().unwrap();
        // Timed out: a lock, a read hold behind a writer, a permit.
        let _taken = other.lock("taken").unwrap().lock().unwrap();
        let lock = client.lock("taken").unwrap();
        assert!(lock
            .try_lock_for(Duration::from_millis(150))
            .unwrap()
            .is_none());
        let _writer = other.rw_lock("table").unwrap().write().unwrap();
        let table = client.rw_lock("table").unwrap();
        assert!(table
            .try_read_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
        let pool = other.semaphore("pool").unwrap();
        assert_eq!(pool.try_set_permits(1).unwrap(), 1);
        let _permit = pool.acquire().unwrap();
        let pool = client.semaphore("pool").unwrap();
        assert!(pool
            .try_acquire_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
        // Failed: the lock's key holds a string.
        let _: () = redis::cmd("SET")
            .arg(lock_key("wrong"))
            .arg("x")
            .query(&mut server.connection())
            .unwrap();
        assert!(client.lock("wrong").unwrap().lock().is_err());
        // A latch's wait is no acquisition: no span.
        let latch = client.count_down_latch("gate").unwrap();
        assert!(latch.try_set_count(1).unwrap());
        assert!(!latch.wait_for(Duration::from_millis(50)).unwrap());
        token
    });

    let spans = keeper.spans();
    assert_eq!(spans.len(), 7, "{spans:#?}");
    for span in &spans {
        assert_eq!(span.name, "acquire", "{span:?}");
        assert_eq!(span.target, "redbaton", "{span:?}");
        assert_eq!(span.level, Level::INFO, "{span:?}");
        assert!(span.closed, "{span:?}");
    }
    fn fields(span: &SpanSeen) -> [Option<&str>; 4] {
        ["name", "kind", "outcome", "how"].map(|field| span.field(field))
    }
    let (contended, broken, free) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(
        fields(contended),
        [
            Some("busy"),
            Some("lock"),
            Some("acquired"),
            Some("after_waiting")
        ]
    );
    assert_eq!(
        contended.field("fencing_token"),
        Some(contended_token.to_string().as_str())
    );
    assert!(
        waited_ms(contended) >= HELD_ON.as_secs_f64() * 1e3,
        "{contended:?}"
    );
    assert_eq!(
        fields(broken),
        [Some("broken"), Some("lock"), Some("failed"), None]
    );
    assert_eq!(broken.field("fencing_token"), None, "{broken:?}");
    assert_eq!(
        fields(free),
        [
            Some("free"),
            Some("lock"),
            Some("acquired"),
            Some("first_attempt")
        ]
    );
    assert_eq!(
        free.field("fencing_token"),
        Some(free_token.to_string().as_str())
    );
    assert!(waited_ms(free) < 5_000.0, "{free:?}");
    for (span, name, kind, at_least) in [
        (&spans[3], "taken", "lock", 100.0),
        (&spans[4], "table", "read", 50.0),
        (&spans[5], "pool", "permits", 50.0),
    ] {
        assert_eq!(
            fields(span),
            [Some(name), Some(kind), Some("timed_out"), None],
            "{span:?}"
        );
        assert_eq!(span.field("fencing_token"), None, "{span:?}");
        assert!(waited_ms(span) >= at_least, "{span:?}");
    }
    let failed = &spans[6];
    assert_eq!(
        fields(failed),
        [Some("wrong"), Some("lock"), Some("failed"), None]
    );
    assert!(waited_ms(failed) >= 0.0, "{failed:?}");

    // The wait's events are told inside its span, the acquisition's too.
    let seen = keeper.seen();
    let told_in = |message: &str, name: &str| {
        seen.iter()
            .filter(|s| s.field("message") == Some(message) && s.field("name") == Some(name))
            .map(|s| s.span)
            .collect::<Vec<_>>()
    };
    assert_eq!(told_in("parked", "busy"), [Some(contended.id)]);
    assert_eq!(told_in("woken", "busy"), [Some(contended.id)]);
    assert_eq!(told_in("acquired", "busy"), [Some(contended.id)]);
    assert_eq!(told_in("acquired", "free"), [Some(free.id)]);
    assert_eq!(told_in("timed out", "taken"), [Some(spans[3].id)]);
    assert_eq!(told_in("acquisition failed", "wrong"), [Some(failed.id)]);
    assert_eq!(told_in("parked", "broken"), [Some(broken.id)]);
    assert_eq!(told_in("acquisition failed", "broken"), [Some(broken.id)]);
    // The latch's wait: told outside any span.
    assert_eq!(told_in("parked", "gate"), [None]);
    assert_eq!(told_in("timed out", "gate"), [None]);
}

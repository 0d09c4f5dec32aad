//! `ClientBuilder::tracing`: the `tracing` events a client makes, seen by
//! a small subscriber set for the test's thread only (`with_default`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::support::lock_key;

/// One `tracing` event: its target, level and fields (`message` too), as
/// text.
#[derive(Debug, Clone)]
struct Seen {
    target: String,
    level: Level,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Keeps every event; has no spans.
#[derive(Clone, Default)]
struct Keeper(Arc<Mutex<Vec<Seen>>>);

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

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Seen {
            target: event.metadata().target().to_owned(),
            level: *event.metadata().level(),
            fields,
        });
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

impl Keeper {
    /// The events of target `redbaton`.
    fn seen(&self) -> Vec<Seen> {
        let seen = self.0.lock().unwrap();
        seen.iter()
            .filter(|s| s.target == "redbaton")
            .cloned()
            .collect()
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

//! Locked functions called by several real processes (this binary re-run
//! as children, see `child_entry`): on one key exactly one runs and the
//! other is busy, or waits its turn with `wait`; on different keys they
//! run at the same time.
//!
//! Every body records `in <who>` and `out <who>` in the Redis list
//! `events`, and between the two waits (bounded) for the parent to push to
//! `leave:<who>`: the parent decides when each holder leaves, so the
//! situations are made, not hoped for.

use std::time::Duration;

use redbaton::Client;
use testkit::{ChildProcess, RedisServer};

use crate::support::{eventually, spawn_child};
use crate::AppError;

/// How long anything in these tests may take before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(30);

/// One attempt on `order:<order_id>`.
#[redbaton::locked(client = client, key = "order:{order_id}")]
fn pay_once(
    client: &Client,
    redis: &mut redis::Connection,
    order_id: u64,
    who: &str,
) -> Result<(), AppError> {
    inside(redis, who)
}

/// Waits up to 20 s for `order:<order_id>`.
#[redbaton::locked(client = client, key = "order:{order_id}", wait = "20s")]
fn pay_waiting(
    client: &Client,
    redis: &mut redis::Connection,
    order_id: u64,
    who: &str,
) -> Result<(), AppError> {
    inside(redis, who)
}

/// A body: says it is in, waits for the parent's word, says it is out.
fn inside(redis: &mut redis::Connection, who: &str) -> Result<(), AppError> {
    redis::cmd("RPUSH")
        .arg("events")
        .arg(format!("in {who}"))
        .query::<()>(redis)?;
    let word: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(format!("leave:{who}"))
        .arg(PATIENCE.as_secs())
        .query(redis)?;
    if word.is_none() {
        return Err(AppError::Declined);
    }
    redis::cmd("RPUSH")
        .arg("events")
        .arg(format!("out {who}"))
        .query::<()>(redis)?;
    Ok(())
}

/// This file's child-process roles (run by the binary's `child_entry`):
/// `pay-once:<order>:<who>` and `pay-waiting:<order>:<who>`; false for a
/// role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    let mut parts = role.split(':');
    let (Some(mode), Some(order), Some(who)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if mode != "pay-once" && mode != "pay-waiting" {
        return false;
    }
    let order: u64 = order.parse().unwrap();
    let client = Client::open(url).unwrap();
    let mut redis = redis::Client::open(url).unwrap().get_connection().unwrap();
    println!("READY");
    let go: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(format!("go:{who}"))
        .arg(PATIENCE.as_secs())
        .query(&mut redis)
        .unwrap();
    assert!(go.is_some(), "no word to go within {PATIENCE:?}");
    println!("CALLING");
    let outcome = if mode == "pay-once" {
        pay_once(&client, &mut redis, order, who)
    } else {
        pay_waiting(&client, &mut redis, order, who)
    };
    match outcome {
        Ok(()) => println!("OUTCOME ran"),
        Err(error) => match error.busy_name() {
            Some(name) => println!("OUTCOME busy {name}"),
            None => println!("OUTCOME error {error}"),
        },
    }
    true
}

/// The children of one test, by the name their role gives them.
struct Children {
    server: RedisServer,
    children: Vec<(String, ChildProcess)>,
}

impl Children {
    /// Starts one child per `(mode, order, who)`, each ready to call.
    fn start(roles: &[(&str, u64, &str)]) -> Children {
        let server = RedisServer::start();
        let mut children: Vec<(String, ChildProcess)> = roles
            .iter()
            .map(|(mode, order, who)| {
                let child = spawn_child(&format!("{mode}:{order}:{who}"), &server);
                ((*who).to_owned(), child)
            })
            .collect();
        for (_, child) in &mut children {
            child.wait_for_line("READY", PATIENCE);
        }
        Children { server, children }
    }

    fn child(&mut self, who: &str) -> &mut ChildProcess {
        &mut self
            .children
            .iter_mut()
            .find(|(name, _)| name == who)
            .unwrap()
            .1
    }

    /// Pushes a word to each of `lists` in one command, so that the
    /// children it wakes start together.
    fn push(&self, lists: &[String]) {
        let mut pipe = redis::pipe();
        for list in lists {
            pipe.cmd("RPUSH").arg(list).arg(1).ignore();
        }
        pipe.atomic()
            .query::<()>(&mut self.server.connection())
            .unwrap();
    }

    fn go(&self, whos: &[&str]) {
        self.push(&whos.iter().map(|w| format!("go:{w}")).collect::<Vec<_>>());
    }

    fn leave(&self, who: &str) {
        self.push(&[format!("leave:{who}")]);
    }

    fn events(&self) -> Vec<String> {
        redis::cmd("LRANGE")
            .arg("events")
            .arg(0)
            .arg(-1)
            .query(&mut self.server.connection())
            .unwrap()
    }

    /// Waits (bounded) until `events` has `count` entries, and returns them.
    fn events_once(&self, count: usize) -> Vec<String> {
        eventually(PATIENCE, &format!("{count} events"), || {
            self.events().len() >= count
        });
        self.events()
    }

    /// The child's outcome line, after which it exits.
    fn outcome(&mut self, who: &str) -> String {
        let lines = self
            .child(who)
            .lines_with_prefix_until_exit("OUTCOME", PATIENCE);
        assert_eq!(lines.len(), 1, "{who}: {lines:?}");
        lines[0].clone()
    }

    fn is_locked(&self, name: &str) -> bool {
        let client = crate::support::client(&self.server);
        client.lock(name).unwrap().is_locked().unwrap()
    }
}

/// The child of `pair` that is not `who`.
fn other<'a>(pair: [&'a str; 2], who: &str) -> &'a str {
    if pair[0] == who {
        pair[1]
    } else {
        pair[0]
    }
}

#[test]
fn two_processes_on_one_key_one_runs_and_the_other_is_busy() {
    let mut children = Children::start(&[("pay-once", 7, "a"), ("pay-once", 7, "b")]);
    children.go(&["a", "b"]);
    let events = children.events_once(1);
    let winner = events[0].strip_prefix("in ").unwrap().to_owned();
    let loser = other(["a", "b"], &winner);
    // The winner stays inside until told to leave: the loser's one attempt
    // found the lock held, and its body never ran.
    assert_eq!(children.outcome(loser), "busy order:7");
    assert_eq!(children.events(), [format!("in {winner}")]);
    children.leave(&winner);
    assert_eq!(children.outcome(&winner), "ran");
    assert_eq!(
        children.events(),
        [format!("in {winner}"), format!("out {winner}")]
    );
    assert!(!children.is_locked("order:7"), "released on return");
}

#[test]
fn with_wait_the_second_process_runs_once_the_first_leaves() {
    let mut children = Children::start(&[("pay-waiting", 7, "a"), ("pay-waiting", 7, "b")]);
    children.go(&["a", "b"]);
    let events = children.events_once(1);
    let first = events[0].strip_prefix("in ").unwrap().to_owned();
    let second = other(["a", "b"], &first);
    children.child(second).wait_for_line("CALLING", PATIENCE);
    // Only to make the situation: the second is parked on the lock, not
    // still on its way to it. The assertions hold either way.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(children.events(), [format!("in {first}")]);
    children.leave(&first);
    let events = children.events_once(3);
    assert_eq!(
        events,
        [
            format!("in {first}"),
            format!("out {first}"),
            format!("in {second}")
        ]
    );
    children.leave(second);
    assert_eq!(children.outcome(&first), "ran");
    assert_eq!(children.outcome(second), "ran");
    assert_eq!(children.events().len(), 4);
    assert!(!children.is_locked("order:7"));
}

#[test]
fn two_processes_on_different_keys_run_at_the_same_time() {
    let mut children = Children::start(&[("pay-once", 1, "a"), ("pay-once", 2, "b")]);
    children.go(&["a", "b"]);
    // Both are inside before either is told to leave.
    let mut events = children.events_once(2);
    events.sort();
    assert_eq!(events, ["in a", "in b"]);
    assert!(children.is_locked("order:1") && children.is_locked("order:2"));
    children.leave("a");
    children.leave("b");
    assert_eq!(children.outcome("a"), "ran");
    assert_eq!(children.outcome("b"), "ran");
    assert!(!children.is_locked("order:1") && !children.is_locked("order:2"));
}

#[test]
fn a_wait_that_runs_out_while_another_process_holds_the_key_is_busy() {
    let mut children = Children::start(&[("pay-once", 7, "a")]);
    children.go(&["a"]);
    children.events_once(1);

    let client = crate::support::client(&children.server);
    let started = std::time::Instant::now();
    let outcome = pay_briefly(&client, 7);
    let waited = started.elapsed();
    assert_eq!(outcome.unwrap_err().busy_name(), Some("order:7"));
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "gave up after {waited:?}"
    );
    children.leave("a");
    assert_eq!(children.outcome("a"), "ran");
}

/// Waits 300 ms for `order:<order_id>`; the body is never expected to run.
#[redbaton::locked(client = client, key = "order:{order_id}", wait = "300ms")]
fn pay_briefly(client: &Client, order_id: u64) -> Result<(), AppError> {
    Err(AppError::Declined)
}

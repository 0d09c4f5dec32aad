//! A property test: random sequences of lock / try_lock / re-entry / unlock
//! across three threads, checked against a simple reference model, with the
//! Redis state compared to the model after every step.

mod support;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redbaton::{Client, Holder};
use support::JoinWithin;
use testkit::RedisServer;

const THREADS: usize = 3;
const NAMES: [&str; 2] = ["left", "right"];

#[derive(Debug, Clone)]
enum Op {
    /// `try_lock` on thread `thread`: acquires, re-enters, or finds it held.
    TryLock { thread: usize, name: usize },
    /// Unlock one of the thread's guards (any of them, not only the last).
    Unlock { thread: usize, pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..THREADS, 0..NAMES.len()).prop_map(|(thread, name)| Op::TryLock { thread, name }),
        (0..THREADS, 0..8usize).prop_map(|(thread, pick)| Op::Unlock { thread, pick }),
    ]
}

/// What a worker thread is asked to do; guards never leave their thread.
enum Command {
    TryLock(usize, Sender<Option<u64>>),
    Unlock(usize, Sender<Option<(usize, bool)>>),
    DropAll(Sender<()>),
}

fn worker(client: Client, commands: Receiver<Command>) {
    let locks: Vec<_> = NAMES.iter().map(|n| client.lock(n).unwrap()).collect();
    let mut guards: Vec<(usize, redbaton::LockGuard)> = Vec::new();
    for command in commands {
        match command {
            Command::TryLock(name, reply) => {
                let guard = locks[name].try_lock().unwrap();
                let fence = guard.as_ref().map(|g| g.fencing_token());
                if let Some(guard) = guard {
                    guards.push((name, guard));
                }
                reply.send(fence).unwrap();
            }
            Command::Unlock(pick, reply) => {
                if guards.is_empty() {
                    reply.send(None).unwrap();
                    continue;
                }
                let (name, guard) = guards.remove(pick % guards.len());
                reply.send(Some((name, guard.unlock().is_ok()))).unwrap();
            }
            Command::DropAll(reply) => {
                guards.clear();
                reply.send(()).unwrap();
            }
        }
    }
}

/// The reference model: who holds each name, how deep, with which token.
#[derive(Default)]
struct Model {
    held: HashMap<usize, (usize, u32, u64)>,
    last_fence: HashMap<usize, u64>,
    guards: Vec<Vec<usize>>,
}

struct Harness {
    workers: Vec<(Sender<Command>, JoinHandle<()>)>,
    client: Client,
    raw: redis::Connection,
    identities: HashMap<usize, String>,
}

const REPLY: Duration = Duration::from_secs(10);

impl Harness {
    /// Every case starts clean, also after a failed one (shrinking re-runs).
    fn reset(&mut self, model: &mut Model) {
        self.drop_all_guards();
        redis::cmd("FLUSHALL").query::<()>(&mut self.raw).unwrap();
        model.guards = vec![Vec::new(); THREADS];
        model.held.clear();
    }

    fn drop_all_guards(&self) {
        for (worker, _) in &self.workers {
            let (tx, rx) = mpsc::channel();
            worker.send(Command::DropAll(tx)).unwrap();
            rx.recv_timeout(REPLY).unwrap();
        }
    }

    fn run(&mut self, ops: &[Op], model: &mut Model) -> Result<(), TestCaseError> {
        self.reset(model);
        for op in ops {
            match *op {
                Op::TryLock { thread, name } => {
                    let (tx, rx) = mpsc::channel();
                    self.workers[thread]
                        .0
                        .send(Command::TryLock(name, tx))
                        .unwrap();
                    let got = rx.recv_timeout(REPLY).unwrap();
                    match (model.held.get(&name).copied(), got) {
                        (None, Some(fence)) => {
                            let last = model.last_fence.get(&name).copied().unwrap_or(0);
                            prop_assert!(fence > last, "fresh token {} after {}", fence, last);
                            model.last_fence.insert(name, fence);
                            model.held.insert(name, (thread, 1, fence));
                            model.guards[thread].push(name);
                        }
                        (Some((owner, depth, held_fence)), Some(fence)) if owner == thread => {
                            prop_assert_eq!(fence, held_fence, "re-entry keeps the token");
                            model.held.insert(name, (owner, depth + 1, held_fence));
                            model.guards[thread].push(name);
                        }
                        (Some((owner, _, _)), None) => prop_assert_ne!(owner, thread),
                        (expected, got) => {
                            return Err(TestCaseError::fail(format!(
                                "thread {thread} try_lock {name}: model {expected:?}, got {got:?}"
                            )))
                        }
                    }
                }
                Op::Unlock { thread, pick } => {
                    let (tx, rx) = mpsc::channel();
                    self.workers[thread]
                        .0
                        .send(Command::Unlock(pick, tx))
                        .unwrap();
                    let released = rx.recv_timeout(REPLY).unwrap();
                    let guards = &mut model.guards[thread];
                    match released {
                        None => prop_assert!(guards.is_empty()),
                        Some((name, ok)) => {
                            prop_assert!(ok, "unlock failed");
                            prop_assert!(
                                !guards.is_empty(),
                                "the worker had a guard the model had not"
                            );
                            let index = pick % guards.len();
                            prop_assert_eq!(guards.remove(index), name);
                            let (owner, depth, fence) = model.held[&name];
                            prop_assert_eq!(owner, thread);
                            if depth == 1 {
                                model.held.remove(&name);
                            } else {
                                model.held.insert(name, (owner, depth - 1, fence));
                            }
                        }
                    }
                }
            }
            self.check_redis(model)?;
        }
        self.drop_all_guards();
        for name in NAMES {
            prop_assert_eq!(self.client.lock(name).unwrap().holder().unwrap(), None);
        }
        Ok(())
    }

    fn check_redis(&mut self, model: &Model) -> Result<(), TestCaseError> {
        for (index, name) in NAMES.iter().enumerate() {
            let holder = self.client.lock(name).unwrap().holder().unwrap();
            match (model.held.get(&index), holder) {
                (None, None) => {}
                (
                    Some(&(thread, depth, fence)),
                    Some(Holder {
                        owner,
                        depth: d,
                        fencing_token,
                        remaining_lease,
                        ..
                    }),
                ) => {
                    prop_assert_eq!(d, depth, "depth of {}", name);
                    prop_assert_eq!(fencing_token, fence);
                    prop_assert!(remaining_lease.is_some_and(|l| l > Duration::ZERO));
                    let known = self
                        .identities
                        .entry(thread)
                        .or_insert_with(|| owner.to_string());
                    prop_assert_eq!(&*known, &owner.to_string(), "one identity per thread");
                }
                (expected, got) => {
                    return Err(TestCaseError::fail(format!(
                        "{name}: model {expected:?}, Redis {got:?}"
                    )))
                }
            }
        }
        Ok(())
    }
}

#[test]
fn random_lock_sequences_on_three_threads_match_the_model_and_redis() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (tx, rx) = mpsc::channel();
            let client = client.clone();
            (tx, thread::spawn(move || worker(client, rx)))
        })
        .collect();
    // The runner wants an `Fn`; the harness and model change between cases.
    let harness = RefCell::new(Harness {
        workers,
        client,
        raw: server.connection(),
        identities: HashMap::new(),
    });
    let model = RefCell::new(Model::default());
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        harness.borrow_mut().run(&ops, &mut model.borrow_mut())
    });
    for (worker, handle) in harness.into_inner().workers {
        drop(worker);
        handle.joined();
    }
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

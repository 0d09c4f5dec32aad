//! Locked functions called in one process: the lock they hold is the one
//! their arguments name, it is held for the whole body and released
//! however the body ends (value, `return`, `?`, panic), re-entry joins the
//! ownership, and every failure comes back through the function's own
//! error type.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redbaton::{Client, Error, Holder};
use testkit::RedisServer;

use crate::support::{self, JoinWithin};
use crate::AppError;

/// How long anything in these tests may take before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(30);

thread_local! {
    /// How many locked bodies ran on this thread.
    static BODIES_RUN: Cell<u32> = const { Cell::new(0) };
}

fn bodies_run() -> u32 {
    BODIES_RUN.with(Cell::get)
}

fn body_runs() {
    BODIES_RUN.with(|runs| runs.set(runs.get() + 1));
}

/// What the body saw of the lock `name`: its holder (who, depth, token).
fn holder_of(client: &Client, name: &str) -> Result<Holder, Error> {
    Ok(client.lock(name)?.holder()?.expect("held during the body"))
}

#[redbaton::locked(client = client, key = "tenant:{tenant}:order:{order}")]
fn inspect(client: &Client, tenant: &str, order: u64) -> Result<Holder, AppError> {
    body_runs();
    let other = client.lock(&format!("tenant:{tenant}:order:{}", order + 1))?;
    assert!(!other.is_locked()?, "only the named lock is taken");
    Ok(holder_of(
        client,
        &format!("tenant:{tenant}:order:{order}"),
    )?)
}

#[test]
fn the_key_is_built_from_the_arguments_and_held_for_the_body() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let holder = inspect(&client, "acme", 42).unwrap();
    assert_eq!(holder.depth, 1);
    let lock = client.lock("tenant:acme:order:42").unwrap();
    assert!(!lock.is_locked().unwrap(), "released on return");
    assert!(!lock.is_held_by_current_thread());
}

#[redbaton::locked(client = client, key = "nightly {{report}}")]
fn nightly(client: &Client) -> Result<Holder, AppError> {
    Ok(holder_of(client, "nightly {report}")?)
}

#[test]
fn a_key_without_captures_is_used_as_written() {
    let server = RedisServer::start();
    let client = support::client(&server);
    assert_eq!(nightly(&client).unwrap().depth, 1);
}

struct Account {
    locks: Client,
    id: u64,
}

impl Account {
    #[redbaton::locked(client = self.locks, key = { format!("account:{}", self.id) }, fencing = token)]
    fn audit(&self) -> Result<(Holder, u64), AppError> {
        Ok((
            holder_of(&self.locks, &format!("account:{}", self.id))?,
            token,
        ))
    }
}

#[test]
fn a_method_takes_its_client_and_key_from_self() {
    let server = RedisServer::start();
    let account = Account {
        locks: support::client(&server),
        id: 7,
    };
    let (holder, token) = account.audit().unwrap();
    assert_eq!(
        holder.fencing_token, token,
        "`fencing` binds the holder's token"
    );
    let (_, next) = account.audit().unwrap();
    assert!(next > token, "a fresh acquisition gets a larger token");
    assert!(!account
        .locks
        .lock("account:7")
        .unwrap()
        .is_locked()
        .unwrap());
}

#[redbaton::locked(client = client, key = "order:{id}", fencing = outer_token)]
fn outer(client: &Client, id: u64) -> Result<(u64, u64, u32), AppError> {
    let (inner_token, depth) = inner(client, id)?;
    Ok((outer_token, inner_token, depth))
}

#[redbaton::locked(client = client, key = "order:{id}", fencing = inner_token)]
fn inner(client: &Client, id: u64) -> Result<(u64, u32), AppError> {
    Ok((
        inner_token,
        holder_of(client, &format!("order:{id}"))?.depth,
    ))
}

#[test]
fn a_locked_function_calling_another_on_the_same_key_re_enters() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let (outer_token, inner_token, depth) = outer(&client, 3).unwrap();
    assert_eq!(outer_token, inner_token, "re-entry joins the ownership");
    assert_eq!(depth, 2);
    assert!(!client.lock("order:3").unwrap().is_locked().unwrap());
}

#[redbaton::locked(client = client, key = "order:{id}")]
fn panics(client: &Client, id: u64) -> Result<(), AppError> {
    body_runs();
    panic!("the body of order {id} panicked");
}

#[redbaton::locked(client = client, key = "order:{id}")]
fn runs(client: &Client, id: u64) -> Result<(), AppError> {
    body_runs();
    Ok(())
}

#[test]
fn a_panic_in_the_body_releases_the_lock() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let before = bodies_run();
    let unwound = panic::catch_unwind(AssertUnwindSafe(|| panics(&client, 5)));
    assert!(unwound.is_err());
    assert!(!client.lock("order:5").unwrap().is_locked().unwrap());
    // Another client (as another process would) takes it at once.
    let other = support::client(&server);
    assert!(runs(&other, 5).is_ok());
    assert_eq!(bodies_run() - before, 2);
}

#[redbaton::locked(client = client, key = "order:{id}")]
fn declines(
    client: &Client,
    redis: &mut redis::Connection,
    id: u64,
    early: bool,
) -> Result<(), AppError> {
    if early {
        return Err(AppError::Declined);
    }
    let count: i64 = redis::cmd("INCRBY")
        .arg("count")
        .arg("not a number")
        .query(redis)?;
    unreachable!("Redis added a non-number: {count}");
}

#[test]
fn return_and_question_mark_in_the_body_keep_their_meaning_and_release() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let mut redis = server.connection();
    let lock = client.lock("order:9").unwrap();
    let early = declines(&client, &mut redis, 9, true);
    assert!(matches!(early, Err(AppError::Declined)), "{early:?}");
    assert!(!lock.is_locked().unwrap());
    let failed = declines(&client, &mut redis, 9, false);
    assert!(matches!(failed, Err(AppError::Redis(_))), "{failed:?}");
    assert!(!lock.is_locked().unwrap());
}

/// Holds `name` on another thread until the returned sender is used or
/// dropped; returns once it is held.
pub(crate) fn hold_elsewhere(
    client: &Client,
    name: &str,
) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let lock = client.lock(name).unwrap();
    let holder = thread::spawn(move || {
        let guard = lock.lock().unwrap();
        held_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(PATIENCE);
        guard.unlock().unwrap();
    });
    held_rx.recv_timeout(PATIENCE).expect("the lock was taken");
    (release_tx, holder)
}

#[test]
fn a_key_held_by_another_thread_is_busy_and_the_body_does_not_run() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let (release, holder) = hold_elsewhere(&client, "order:4");
    let before = bodies_run();
    let error = runs(&client, 4).unwrap_err();
    assert_eq!(bodies_run(), before, "the body did not run");
    assert_eq!(error.busy_name(), Some("order:4"));
    let AppError::Lock(error) = error else {
        panic!("not a lock error");
    };
    assert!(error.is_busy() && !error.is_transient());
    let message = error.to_string();
    assert!(
        message.contains("\"order:4\"") && message.contains("wait = \"5s\""),
        "{message}"
    );
    release.send(()).unwrap();
    holder.joined();
    assert!(runs(&client, 4).is_ok());
    assert_eq!(bodies_run(), before + 1);
}

#[redbaton::locked(client = client, key = "order:{id}", wait = "10s")]
fn waits(client: &Client, id: u64) -> Result<Instant, AppError> {
    Ok(Instant::now())
}

#[test]
fn with_wait_the_call_runs_when_the_holder_releases() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let (release, holder) = hold_elsewhere(&client, "order:6");
    let released_at = thread::spawn(move || {
        // Only to make the situation: the call below is waiting by then.
        thread::sleep(Duration::from_millis(300));
        let at = Instant::now();
        release.send(()).unwrap();
        at
    });
    let entered = waits(&client, 6).unwrap();
    let released_at = released_at.joined();
    holder.joined();
    assert!(entered >= released_at, "the body ran before the release");
}

#[redbaton::locked(client = client, key = "lease:{id}", lease = "600ms", fencing = token)]
fn renewed_lease(client: &Client, id: u64) -> Result<(), AppError> {
    let name = format!("lease:{id}");
    let first = holder_of(client, &name)?;
    let left = first.remaining_lease.expect("every lock has a lease");
    assert!(left <= Duration::from_millis(600), "{left:?}");
    // Only to make the situation: past two leases of 600 ms.
    thread::sleep(Duration::from_millis(1_500));
    let later = holder_of(client, &name)?;
    assert_eq!((later.fencing_token, later.depth), (token, 1), "still ours");
    let left = later.remaining_lease.expect("every lock has a lease");
    assert!(left <= Duration::from_millis(600), "{left:?}");
    Ok(())
}

#[redbaton::locked(client = client, key = "lease:{id}", fixed_lease = "2s")]
fn fixed_lease(client: &Client, id: u64) -> Result<Duration, AppError> {
    Ok(holder_of(client, &format!("lease:{id}"))?
        .remaining_lease
        .expect("every lock has a lease"))
}

#[test]
fn the_lease_options_set_the_locks_lease() {
    let server = RedisServer::start();
    let client = support::client(&server);
    renewed_lease(&client, 1).unwrap();
    assert!(client.watchdog_stats().renewals >= 2);
    let left = fixed_lease(&client, 2).unwrap();
    assert!(
        left <= Duration::from_secs(2) && left > Duration::from_secs(1),
        "{left:?}"
    );
}

#[redbaton::locked(client = client, key = { name })]
fn named(client: &Client, name: &str) -> Result<(), AppError> {
    body_runs();
    Ok(())
}

#[test]
fn redis_failures_and_bad_keys_come_back_through_the_functions_error_type() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let before = bodies_run();
    let error = named(&client, "").unwrap_err();
    assert!(
        matches!(error, AppError::Lock(Error::InvalidName { .. })),
        "{error:?}"
    );
    server.kill();
    let error = named(&client, "order:1").unwrap_err();
    assert!(
        matches!(&error, AppError::Lock(e) if e.is_unreachable()),
        "{error:?}"
    );
    assert_eq!(bodies_run(), before, "no body ran");
}

#[redbaton::locked(client = client, key = "shelf:{shelf}", rw = read)]
fn read_shelf(
    client: &Client,
    shelf: u32,
    inside: mpsc::Sender<()>,
    leave: &mpsc::Receiver<()>,
) -> Result<(), AppError> {
    inside.send(()).expect("the test listens");
    leave.recv_timeout(PATIENCE).expect("told to leave");
    Ok(())
}

#[redbaton::locked(client = client, key = "shelf:{shelf}", rw = write, fencing = token)]
fn write_shelf(client: &Client, shelf: u32) -> Result<u64, AppError> {
    Ok(token)
}

#[redbaton::locked(client = client, key = "slots", semaphore = 2)]
fn two_slots(client: &Client) -> Result<u64, AppError> {
    Ok(client.semaphore("slots")?.available_permits()?)
}

#[redbaton::locked(client = client, key = "slots", semaphore)]
fn one_slot(
    client: &Client,
    inside: mpsc::Sender<()>,
    leave: &mpsc::Receiver<()>,
) -> Result<(), AppError> {
    inside.send(()).expect("the test listens");
    leave.recv_timeout(PATIENCE).expect("told to leave");
    Ok(())
}

#[redbaton::locked(client = client, key = "turnstile", fair, fencing = token)]
fn through_the_turnstile(client: &Client) -> Result<(u64, Option<Holder>), AppError> {
    Ok((token, client.fair_lock("turnstile")?.holder()?))
}

#[test]
fn fair_rw_and_semaphore_options_hold_what_they_name() {
    let server = RedisServer::start();
    let client = support::client(&server);

    // Two readers at once; a writer is busy meanwhile, then gets in.
    let (inside, entered) = mpsc::channel();
    let (leave_tx, leave) = mpsc::channel::<()>();
    let (leave_tx2, leave2) = mpsc::channel::<()>();
    let readers: Vec<_> = [leave, leave2]
        .into_iter()
        .map(|leave| {
            let (client, inside) = (client.clone(), inside.clone());
            thread::spawn(move || read_shelf(&client, 7, inside, &leave).map_err(|e| e.to_string()))
        })
        .collect();
    for _ in 0..2 {
        entered
            .recv_timeout(PATIENCE)
            .expect("both readers inside at once");
    }
    let busy = write_shelf(&client, 7).unwrap_err();
    assert_eq!(busy.busy_name(), Some("shelf:7"), "{busy}");
    leave_tx.send(()).unwrap();
    leave_tx2.send(()).unwrap();
    for reader in readers {
        reader.joined().unwrap();
    }
    let token = write_shelf(&client, 7).unwrap();
    assert!(token > 0, "a writer's fencing token");

    // Permits: a semaphore of 2; a body holding 1 leaves 1, two are busy.
    let slots = client.semaphore("slots").unwrap();
    slots.try_set_permits(2).unwrap();
    assert_eq!(
        two_slots(&client).unwrap(),
        0,
        "both permits held in the body"
    );
    let (inside, entered) = mpsc::channel();
    let (leave_tx, leave) = mpsc::channel::<()>();
    let holder = {
        let client = client.clone();
        thread::spawn(move || one_slot(&client, inside, &leave).map_err(|e| e.to_string()))
    };
    entered.recv_timeout(PATIENCE).unwrap();
    assert_eq!(two_slots(&client).unwrap_err().busy_name(), Some("slots"));
    leave_tx.send(()).unwrap();
    holder.joined().unwrap();
    assert_eq!(slots.available_permits().unwrap(), 2, "released on return");

    // The fair lock, with its token, is what the body holds.
    let (token, holder) = through_the_turnstile(&client).unwrap();
    let holder = holder.expect("held during the body");
    assert_eq!(holder.fencing_token, token);
    assert!(!client.fair_lock("turnstile").unwrap().is_locked().unwrap());
    assert!(
        !client.lock("turnstile").unwrap().is_locked().unwrap(),
        "not the plain lock"
    );
}

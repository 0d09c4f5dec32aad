//! `keys = [ … ]`: a locked function holds the multi-lock over every name
//! its templates give, all or none, for its whole body.

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use redbaton::{Client, Error, Holder};
use testkit::RedisServer;

use crate::calls::hold_elsewhere;
use crate::support::{self, JoinWithin};
use crate::AppError;

/// What the body saw of the lock `name`: its holder.
fn holder_of(client: &Client, name: &str) -> Result<Holder, Error> {
    Ok(client.lock(name)?.holder()?.expect("held during the body"))
}

fn is_locked(client: &Client, name: &str) -> bool {
    client.lock(name).unwrap().is_locked().unwrap()
}

#[redbaton::locked(client = client, keys = ["account:{from}", "account:{to}"], fixed_lease = "2s", fencing = tokens)]
fn inspect(client: &Client, from: u64, to: u64) -> Result<[(Holder, u64); 2], AppError> {
    let from = holder_of(client, &format!("account:{from}"))?;
    let to = holder_of(client, &format!("account:{to}"))?;
    Ok([(from, tokens[0]), (to, tokens[1])])
}

#[test]
fn every_name_is_held_for_the_body_with_its_token_in_the_order_of_keys() {
    let server = RedisServer::start();
    let client = support::client(&server);
    // Different tokens for the two names: the first one's counter is
    // ahead of the server's clock (names taken in one script share the
    // clock's reading).
    redis::cmd("SET")
        .arg("redbaton:{account:2}:fence")
        .arg(9_000_000_000_000_000_u64)
        .query::<()>(&mut server.connection())
        .unwrap();
    let [(first, first_token), (second, second_token)] = inspect(&client, 2, 1).unwrap();
    assert_eq!((first.fencing_token, first.depth), (first_token, 1));
    assert_eq!((second.fencing_token, second.depth), (second_token, 1));
    assert_ne!(first_token, second_token, "each name has its own token");
    for holder in [&first, &second] {
        let left = holder.remaining_lease.expect("every lock has a lease");
        assert!(
            left <= Duration::from_secs(2) && left > Duration::from_secs(1),
            "the fixed lease: {left:?}"
        );
    }
    assert!(!is_locked(&client, "account:1") && !is_locked(&client, "account:2"));
}

/// How many bodies of `transfer_once` ran.
static ONCE_RAN: AtomicU32 = AtomicU32::new(0);

#[redbaton::locked(client = client, keys = ["account:{from}", "account:{to}"])]
fn transfer_once(client: &Client, from: u64, to: u64) -> Result<(), AppError> {
    ONCE_RAN.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn without_wait_a_function_one_of_whose_names_is_held_is_busy_and_holds_nothing() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let (release, holder) = hold_elsewhere(&client, "account:8");
    let before = ONCE_RAN.load(Ordering::SeqCst);
    let error = transfer_once(&client, 7, 8).unwrap_err();
    assert_eq!(error.busy_name(), Some("account:7, account:8"), "{error}");
    assert_eq!(
        ONCE_RAN.load(Ordering::SeqCst),
        before,
        "the body did not run"
    );
    assert!(!is_locked(&client, "account:7"), "all or none");
    release.send(()).unwrap();
    holder.joined();
    transfer_once(&client, 7, 8).unwrap();
    assert_eq!(ONCE_RAN.load(Ordering::SeqCst), before + 1);
    assert!(!is_locked(&client, "account:7") && !is_locked(&client, "account:8"));
}

/// Bodies of `transfer` inside each account now.
static INSIDE: [AtomicU32; 3] = [const { AtomicU32::new(0) }; 3];
/// Bodies of `transfer` that found one of their accounts occupied.
static OVERLAPS: AtomicU32 = AtomicU32::new(0);
/// Bodies of `transfer` that ran.
static TRANSFERS: AtomicU32 = AtomicU32::new(0);

#[redbaton::locked(client = client, keys = ["account:{from}", "account:{to}"], wait = "30s")]
fn transfer(client: &Client, from: usize, to: usize) -> Result<(), AppError> {
    for account in [from, to] {
        if INSIDE[account].fetch_add(1, Ordering::SeqCst) != 0 {
            OVERLAPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    // Only to widen the window in which an overlap would be seen.
    thread::sleep(Duration::from_millis(2));
    for account in [from, to] {
        INSIDE[account].fetch_sub(1, Ordering::SeqCst);
    }
    TRANSFERS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn functions_on_overlapping_pairs_of_names_never_overlap() {
    const ROUNDS: usize = 15;
    let server = RedisServer::start();
    // Each pair shares one account with each other pair, and every other
    // round names it the other way round (no deadlock either way).
    let threads: Vec<_> = (0..3)
        .map(|first| {
            let client = support::client(&server);
            thread::spawn(move || {
                let second = (first + 1) % 3;
                for round in 0..ROUNDS {
                    let (from, to) = if round % 2 == 0 {
                        (first, second)
                    } else {
                        (second, first)
                    };
                    transfer(&client, from, to).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.joined();
    }
    assert_eq!(TRANSFERS.load(Ordering::SeqCst), 3 * ROUNDS as u32);
    assert_eq!(
        OVERLAPS.load(Ordering::SeqCst),
        0,
        "two bodies shared an account"
    );
}

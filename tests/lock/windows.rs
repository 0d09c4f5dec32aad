//! The hand-over window one script run at a time (`lib/hand_over.lua`):
//! whom a release keeps the lock for, who may take it when, and that a
//! caller kept out makes sure the kept waiter hears of it and is kept the
//! next window. Each client's
//! threads are named `<client>:<n>`, as the crate names them; each attempt
//! is a waiter's, naming the baton.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scripts::{
    attempt, attempt_popping, fence_key, field, release, script, take, tokens, FENCE_TTL_MS,
    LEASE_MS, LONG, WINDOW_MS,
};
use crate::support::{baton_key, eventually, lock_key, JoinWithin};
use testkit::RedisServer;

/// How long the window is its waiter's alone (`KEPT_ONLY_US`).
const KEPT_ONLY: Duration = Duration::from_millis(10);

/// Makes `name`'s window as young as if it had just opened: these tests
/// check who is kept out of its first part, which a loaded machine could
/// otherwise let pass between two of their commands.
fn reopen(raw: &mut redis::Connection, name: &str) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(raw).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(lock_key(name))
        .arg("handover")
        .arg(secs * 1_000_000 + micros)
        .query(raw)
        .unwrap();
}

#[test]
fn a_window_is_kept_for_the_longest_waiting_other_client_alone_at_first() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "kept", "a:1");
    // b's waiter has been asking longest; c's, asking for less, does not
    // take its place.
    assert_eq!(attempt(&mut raw, "kept", "b:1", LONG)[0], 0);
    assert_eq!(attempt(&mut raw, "kept", "c:1", LONG / 2)[0], 0);
    assert_eq!(field(&mut raw, "kept", "queued").as_deref(), Some("b:1"));
    release(&mut raw, "kept", "a:1", fence, false);
    // c asked before the window opened, and is kept out all the same.
    reopen(&mut raw, "kept");
    let refused = attempt(&mut raw, "kept", "c:1", LONG);
    assert_eq!((refused[0], refused.get(2)), (0, Some(&-1)), "{refused:?}");
    assert_eq!(attempt(&mut raw, "kept", "b:1", LONG)[0], 1, "b takes it");
}

#[test]
fn a_window_its_waiter_does_not_take_opens_to_earlier_callers_after_its_first_part() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "late", "a:1");
    assert_eq!(attempt(&mut raw, "late", "b:1", LONG)[0], 0);
    release(&mut raw, "late", "a:1", fence, false);
    let opened = Instant::now();
    // b never comes; c, asking since before the window opened, takes it
    // once the window is no longer b's alone (and long before its end).
    let mut took = None;
    eventually(Duration::from_secs(5), "c takes the window", || {
        let reply = attempt(&mut raw, "late", "c:1", LONG);
        if reply[0] == 1 {
            took = Some(opened.elapsed());
        }
        reply[0] == 1
    });
    let took = took.unwrap();
    // (The window opened before the release's reply came back: a little
    // earlier than `opened`.)
    assert!(
        took >= KEPT_ONLY - Duration::from_millis(1) && took < Duration::from_millis(WINDOW_MS),
        "c took the window {took:?} after it opened"
    );
}

#[test]
fn a_waiter_of_the_holders_own_client_opens_no_window() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "own", "a:1");
    assert_eq!(attempt(&mut raw, "own", "a:2", LONG)[0], 0);
    assert_eq!(field(&mut raw, "own", "queued"), None, "nobody kept");
    release(&mut raw, "own", "a:1", fence, false);
    let left: bool = redis::cmd("EXISTS")
        .arg(lock_key("own"))
        .query(&mut raw)
        .unwrap();
    assert!(!left, "no window: the lock is free");
    assert_eq!(tokens(&mut raw, "own"), 1, "the waiter's baton");
}

#[test]
fn a_caller_kept_out_puts_back_a_token_another_process_took() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "told", "a:1");
    assert_eq!(attempt(&mut raw, "told", "b:1", LONG)[0], 0);
    release(&mut raw, "told", "a:1", fence, false);
    assert_eq!(tokens(&mut raw, "told"), 1, "the release's baton");
    // c's process popped it for c (its look came first): b's look found
    // nothing, and b parks on.
    let _: Option<String> = redis::cmd("LPOP")
        .arg(baton_key("told"))
        .query(&mut raw)
        .unwrap();
    reopen(&mut raw, "told");
    assert_eq!(attempt(&mut raw, "told", "c:1", LONG)[2], -1, "kept out");
    assert_eq!(tokens(&mut raw, "told"), 1, "a token back, for b");
    reopen(&mut raw, "told");
    assert_eq!(attempt(&mut raw, "told", "c:1", LONG)[2], -1, "kept out");
    assert_eq!(tokens(&mut raw, "told"), 1, "one token at most");
    assert_eq!(attempt(&mut raw, "told", "b:1", LONG)[0], 1, "b takes it");
}

#[test]
fn a_rung_caller_kept_out_leaves_the_token_for_the_kept_waiter() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "rung", "a:1");
    assert_eq!(attempt(&mut raw, "rung", "b:1", LONG)[0], 0);
    release(&mut raw, "rung", "a:1", fence, false);
    // c, rung at the release's announcement, would pop the token in its
    // attempt: kept out, it leaves it for b.
    reopen(&mut raw, "rung");
    let refused = attempt_popping(&mut raw, "rung", "c:1", LONG, true);
    assert_eq!(refused[2], -1, "kept out");
    assert_eq!(tokens(&mut raw, "rung"), 1, "the token left for b");
    assert_eq!(attempt_popping(&mut raw, "rung", "b:1", LONG, true)[0], 1);
    assert_eq!(tokens(&mut raw, "rung"), 0, "b popped it");
}

#[test]
fn a_rung_caller_that_takes_a_free_lock_pops_its_token() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    // A release nobody's window keeps (no waiter of another client found
    // it in its way) leaves a token and no window.
    let fence = take(&mut raw, "free", "a:1");
    let _: () = redis::cmd("HSET")
        .arg(lock_key("free"))
        .arg("waited")
        .arg(1)
        .query(&mut raw)
        .unwrap();
    release(&mut raw, "free", "a:1", fence, false);
    assert_eq!(tokens(&mut raw, "free"), 1, "the release's token");
    assert_eq!(field(&mut raw, "free", "handover"), None, "no window");
    // b, rung at the release's announcement, takes the lock with its token.
    assert_eq!(attempt_popping(&mut raw, "free", "b:1", LONG, true)[0], 1);
    assert_eq!(tokens(&mut raw, "free"), 0, "b popped its token");
    assert_eq!(
        field(&mut raw, "free", "waited").as_deref(),
        Some("1"),
        "b waited"
    );
}

/// `id`'s attempt on `name` alone through the multi-lock's script (a
/// waiter's, asking `asking` µs): its reply.
fn attempt_many(raw: &mut redis::Connection, name: &str, id: &str, asking: i64) -> Vec<i64> {
    script("acquire_many")
        .key(lock_key(name))
        .key(fence_key(name))
        .arg(id)
        .arg(FENCE_TTL_MS)
        .arg(1)
        .arg(asking)
        .arg(0)
        .arg(0)
        .arg(LEASE_MS)
        .arg(0)
        .arg(1)
        .arg("")
        .arg(0)
        .invoke(raw)
        .unwrap()
}

#[test]
fn a_waiter_kept_out_of_a_window_is_kept_the_next_one() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "next", "a:1");
    assert_eq!(attempt(&mut raw, "next", "b:1", LONG)[0], 0);
    release(&mut raw, "next", "a:1", fence, false);
    // d, then c (asking longer) are kept out of b's window: c is marked
    // for the next one, and d does not take its place.
    reopen(&mut raw, "next");
    assert_eq!(attempt(&mut raw, "next", "d:1", LONG / 4)[2], -1);
    reopen(&mut raw, "next");
    assert_eq!(attempt(&mut raw, "next", "c:1", LONG / 2)[2], -1);
    reopen(&mut raw, "next");
    assert_eq!(attempt(&mut raw, "next", "d:1", LONG / 4)[2], -1);
    let taken = attempt(&mut raw, "next", "b:1", LONG);
    assert_eq!(taken[0], 1, "b takes its window: {taken:?}");
    // b's ownership is in c's way, though c has not looked since.
    assert_eq!(field(&mut raw, "next", "queued").as_deref(), Some("c:1"));
    assert_eq!(field(&mut raw, "next", "next"), None, "the mark moved");
    assert!(field(&mut raw, "next", "since").is_some(), "c's, moved too");
    for gone in ["handover", "for", "nsince"] {
        assert_eq!(field(&mut raw, "next", gone), None, "the window's {gone}");
    }
    release(&mut raw, "next", "b:1", taken[1], false);
    assert_eq!(field(&mut raw, "next", "for").as_deref(), Some("c:1"));
    reopen(&mut raw, "next");
    assert_eq!(attempt(&mut raw, "next", "d:1", LONG / 4)[2], -1);
    assert_eq!(attempt(&mut raw, "next", "c:1", LONG / 2)[0], 1, "c's turn");
}

#[test]
fn a_waiter_kept_out_of_a_window_its_own_client_takes_is_served_in_memory() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "same", "a:1");
    assert_eq!(attempt(&mut raw, "same", "b:1", LONG)[0], 0);
    release(&mut raw, "same", "a:1", fence, false);
    reopen(&mut raw, "same");
    assert_eq!(attempt(&mut raw, "same", "b:2", LONG / 2)[2], -1);
    let taken = attempt(&mut raw, "same", "b:1", LONG);
    assert_eq!(taken[0], 1, "{taken:?}");
    assert_eq!(field(&mut raw, "same", "queued"), None, "b:2 is b's own");
    assert_eq!(field(&mut raw, "same", "waited").as_deref(), Some("1"));
    release(&mut raw, "same", "b:1", taken[1], false);
    assert_eq!(field(&mut raw, "same", "handover"), None, "no window");
}

#[test]
fn a_multi_lock_taking_a_window_carries_the_waiter_it_marked_next() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let fence = take(&mut raw, "many", "a:1");
    assert_eq!(attempt(&mut raw, "many", "b:1", LONG)[0], 0);
    release(&mut raw, "many", "a:1", fence, false);
    reopen(&mut raw, "many");
    assert_eq!(attempt(&mut raw, "many", "c:1", LONG / 2)[2], -1);
    // e's multi-lock asked before the window opened, and takes it after
    // its first part (b never came).
    eventually(Duration::from_secs(5), "e takes the window", || {
        attempt_many(&mut raw, "many", "e:1", LONG)[0] == 1
    });
    assert_eq!(field(&mut raw, "many", "queued").as_deref(), Some("c:1"));
    assert_eq!(field(&mut raw, "many", "handover"), None);
    assert_eq!(field(&mut raw, "many", "next"), None);
}

/// A waiter parked in `BLPOP` (a user the server refuses `CLIENT
/// TRACKING`) through a window kept for another client's waiter pops the
/// window's token at once; its next attempt names its baton (it parked,
/// window or not: `AcquireArgs::after_park`) and puts the token back for
/// that waiter. The test keeps the window in its first part until the
/// token is back, so that the attempt is kept out, not let in: the window
/// is made to open in 30 s (its first part lasts until then, however slow
/// this thread's polls; reopening it at each poll let the newcomer in
/// when a poll came over the first part's 10 ms late), then ended.
#[test]
fn a_waiter_parked_in_blpop_through_a_window_puts_back_the_token_it_popped() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let url = testkit::untracked_user(&mut raw, &server.url());
    let client = redbaton::Client::open(url.as_str()).unwrap();
    // Connected before the window opens.
    drop(client.lock("elsewhere").unwrap().try_lock().unwrap());
    let fence = take(&mut raw, "popped", "a:1");
    assert_eq!(attempt(&mut raw, "popped", "b:1", LONG)[0], 0);
    release(&mut raw, "popped", "a:1", fence, false);
    // Its first part lasts until the window "opens", 30 s from now, and
    // the window as long.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(lock_key("popped"))
        .arg("handover")
        .arg(secs * 1_000_000 + micros + 30_000_000)
        .query(&mut raw)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(lock_key("popped"))
        .arg(30_000)
        .query(&mut raw)
        .unwrap();
    let pushed = || -> u64 {
        let stats = server.command_calls();
        stats.get("rpush").copied().unwrap_or(0)
    };
    let released = pushed();
    let served = Arc::new(AtomicBool::new(false));
    let newcomer = {
        let served = Arc::clone(&served);
        std::thread::spawn(move || {
            let lock = client.lock("popped").unwrap();
            let guard = lock.try_lock_for(Duration::from_secs(20)).unwrap();
            served.store(true, Ordering::SeqCst);
            guard
                .expect("served once the window ends")
                .unlock()
                .unwrap();
        })
    };
    eventually(Duration::from_secs(10), "the token pushed back", || {
        // (The newcomer's own release pushes one too, once served.)
        let back = pushed() > released;
        assert!(
            !back || !served.load(Ordering::SeqCst),
            "no token came back before the window ended"
        );
        back
    });
    // b never comes: the window ends, and the newcomer takes the lock.
    let _: () = redis::cmd("PEXPIRE")
        .arg(lock_key("popped"))
        .arg(1)
        .query(&mut raw)
        .unwrap();
    newcomer.joined();
}

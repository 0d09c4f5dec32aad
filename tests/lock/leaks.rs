//! What a lock leaves in Redis after its release (issue 9, R1): at most
//! two keys per name, each with a TTL (the baton for `baton_ttl`, the
//! fencing counter for `fence_counter_ttl`), and one identity counter per
//! prefix.

use crate::across_topologies;
use crate::support::lock_key;

use std::thread;
use std::time::Duration;

use redbaton::Client;
use testkit::RedisServer;

#[test]
fn a_thousand_names_used_once_leave_only_keys_that_expire() {
    let server = RedisServer::start();
    let fence_ttl = Duration::from_secs(3600);
    let baton_ttl = Duration::from_secs(5);
    let client = Client::builder(server.url())
        .fence_counter_ttl(fence_ttl)
        .baton_ttl(baton_ttl)
        .build()
        .unwrap();
    const NAMES: usize = 1_000;
    for n in 0..NAMES {
        client
            .lock(&format!("job:{n}"))
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
    }
    let mut raw = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut raw).unwrap();
    let longest = fence_ttl.max(baton_ttl).as_millis() as i64;
    let mut per_name = 0;
    for key in &keys {
        // Per client, not per name: the identity counter and the
        // client's name record.
        if key == "redbaton:identity" || key.starts_with("redbaton:{redbaton:identity}:client:") {
            continue;
        }
        per_name += 1;
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut raw).unwrap();
        assert!(
            pttl > 0 && pttl <= longest,
            "{key} is left with PTTL {pttl}"
        );
    }
    assert!(per_name <= 2 * NAMES, "{per_name} keys for {NAMES} names");
}

#[test]
fn tokens_keep_growing_after_the_fence_counter_expired() {
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .fence_counter_ttl(Duration::from_millis(100))
        .build()
        .unwrap();
    let lock = client.lock("short-counter").unwrap();
    let first = lock.lock().unwrap();
    let before = first.fencing_token();
    first.unlock().unwrap();
    thread::sleep(Duration::from_millis(300));
    let exists: bool = redis::cmd("EXISTS")
        .arg("redbaton:{short-counter}:fence")
        .query(&mut server.connection())
        .unwrap();
    assert!(!exists, "the counter expired");
    let after = lock.lock().unwrap().fencing_token();
    assert!(after > before, "{after} after {before}");
}

/// A token is the larger of the counter + 1 and the server's clock in
/// microseconds: a counter ahead of the clock (a clock set back, a token
/// proposed by a quorum), of the clock's length or longer, is counted on
/// by one; one behind it, or short, gives way to the clock.
#[test]
fn a_token_is_the_counter_plus_one_when_the_counter_is_ahead_of_the_clock() {
    let server = RedisServer::start();
    // The counter is left at the token plus the tokens set aside for
    // in-memory hand-offs: `max_local_handoffs` of them (64 by default).
    for reserve in [64, 0, 1_000_000] {
        let client = Client::builder(server.url())
            .max_local_handoffs(reserve)
            .build()
            .unwrap();
        let lock = client.lock("ahead").unwrap();
        let key = "redbaton:{ahead}:fence";
        let mut raw = server.connection();
        let clock = || -> u64 {
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query(&mut server.connection()).unwrap();
            secs * 1_000_000 + micros
        };
        let mut token_after = |counter: &str| -> u64 {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(counter)
                .query(&mut raw)
                .unwrap();
            let guard = lock.lock().unwrap();
            let token = guard.fencing_token();
            guard.unlock().unwrap();
            let stored: String = redis::cmd("GET").arg(key).query(&mut raw).unwrap();
            assert_eq!(
                stored,
                (token + u64::from(reserve)).to_string(),
                "the counter holds the token given and the tokens set aside"
            );
            token
        };
        // Same number of digits as the clock, ahead of it by a day.
        let ahead = clock() + 86_400_000_000;
        assert_eq!(token_after(&ahead.to_string()), ahead + 1);
        // Longer than the clock.
        assert_eq!(token_after("12345678901234567"), 12_345_678_901_234_568);
        // Behind it, and short: the clock.
        let before = clock();
        let behind = token_after(&(before - 1_000_000).to_string());
        assert!(behind >= before, "{behind} below the clock {before}");
        let before = clock();
        let short = token_after("42");
        assert!(short >= before, "{short} below the clock {before}");
        // Within the tokens set aside for the last ownership: above them.
        let last = token_after("0");
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(last + u64::from(reserve))
            .query(&mut raw)
            .unwrap();
        let guard = lock.lock().unwrap();
        assert!(guard.fencing_token() > last + u64::from(reserve));
        guard.unlock().unwrap();
    }
}

across_topologies! {
    fn a_damaged_fence_counter_is_a_wrong_type_error_naming_the_key(deployment) {
        let client = deployment.client();
        let lock = client.lock("damaged").unwrap();
        for server in deployment.servers_for(&lock_key("damaged")) {
            redis::cmd("SET")
                .arg("redbaton:{damaged}:fence")
                .arg("not a number")
                .query::<()>(&mut server.connection())
                .unwrap();
        }
        let err = lock.try_lock().unwrap_err();
        assert!(
            matches!(err, redbaton::Error::WrongType { .. })
                && err.to_string().contains("redbaton:{damaged}:fence"),
            "{err}"
        );
        assert!(!lock.is_locked().unwrap(), "nothing was written");
        for server in deployment.servers_for(&lock_key("damaged")) {
            let left: String = redis::cmd("GET")
                .arg("redbaton:{damaged}:fence")
                .query(&mut server.connection())
                .unwrap();
            assert_eq!(left, "not a number", "the damaged counter is left as it was");
        }
    }
}

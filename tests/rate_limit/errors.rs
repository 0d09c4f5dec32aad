//! Bad input to the rate limiter is an error, promptly, never a hang; a
//! damaged configuration is reported, not guessed at.

use std::time::{Duration, Instant};

use crate::support::{client, overall_limiter};
use redbaton::{Client, Error, RateMode};
use testkit::RedisServer;

#[test]
fn zero_permits_is_an_error() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "api", 10, Duration::from_secs(1));
    let errors = [
        limiter.try_acquire(0).unwrap_err(),
        limiter.acquire(0).unwrap_err(),
        limiter
            .try_acquire_for(0, Duration::from_secs(1))
            .unwrap_err(),
        limiter
            .try_acquire_until(0, Instant::now() + Duration::from_secs(1))
            .unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::InvalidPermits { permits: 0 }), "{err}");
    }
}

#[test]
fn more_permits_than_the_bucket_holds_is_an_error_not_a_hang() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "api", 10, Duration::from_secs(1));
    let started = Instant::now();
    for permits in [11, u64::MAX] {
        for err in [
            limiter.acquire(permits).unwrap_err(),
            limiter.try_acquire(permits).unwrap_err(),
            limiter.try_acquire_for(permits, Duration::MAX).unwrap_err(),
        ] {
            assert!(
                matches!(err, Error::PermitsOverCapacity { capacity: 10, permits: p, .. } if p == permits),
                "{err}"
            );
            assert!(err.to_string().contains("force_rate"), "{err}");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(limiter.try_acquire(10).unwrap(), "the whole bucket is fine");
}

#[test]
fn zero_and_absurd_rates_are_errors_and_write_nothing() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = client.rate_limiter("api").unwrap();
    let second = Duration::from_secs(1);
    for (permits, per) in [
        (0, second),
        (1_000_000_000_001, second),
        (10, Duration::ZERO),
        (10, Duration::from_micros(999)),
        (10, Duration::from_secs(366 * 24 * 3600)),
        (10, Duration::MAX),
    ] {
        for err in [
            limiter
                .set_rate(RateMode::Overall, permits, per)
                .unwrap_err(),
            limiter
                .force_rate(RateMode::PerClient, permits, per)
                .unwrap_err(),
        ] {
            assert!(
                matches!(err, Error::InvalidRate { permits: p, per: d, .. } if p == permits && d == per),
                "{err}"
            );
        }
    }
    assert_eq!(limiter.rate().unwrap(), None);
}

#[test]
fn acquiring_from_a_limiter_nobody_configured_names_set_rate() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = client.rate_limiter("nobody-set-me").unwrap();
    assert_eq!(limiter.rate().unwrap(), None);
    let started = Instant::now();
    let errors = [
        limiter.acquire(1).unwrap_err(),
        limiter.try_acquire(1).unwrap_err(),
        limiter.try_acquire_for(1, Duration::MAX).unwrap_err(),
        limiter.available_permits().unwrap_err(),
    ];
    assert!(started.elapsed() < Duration::from_secs(1));
    for err in errors {
        assert!(
            matches!(&err, Error::RateNotConfigured { name } if name == "nobody-set-me"),
            "{err}"
        );
        assert!(err.to_string().contains("set_rate"), "{err}");
    }
}

#[test]
fn empty_limiter_name_is_invalid() {
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    let err = client.rate_limiter("").unwrap_err();
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
}

#[test]
fn a_damaged_configuration_is_reported_not_guessed() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut raw = server.connection();
    let limiter = client.rate_limiter("damaged").unwrap();
    redis::cmd("HSET")
        .arg("redbaton:{damaged}:rate:config")
        .arg(&["mode", "sometimes", "permits", "10", "per_us", "1000000"])
        .query::<()>(&mut raw)
        .unwrap();
    for err in [
        limiter.try_acquire(1).unwrap_err(),
        limiter.rate().unwrap_err(),
    ] {
        assert!(matches!(err, Error::WrongType { .. }), "{err}");
        assert!(err.to_string().contains("mode"), "{err}");
    }

    let other = client.rate_limiter("string").unwrap();
    redis::cmd("SET")
        .arg("redbaton:{string}:rate:config")
        .arg("x")
        .query::<()>(&mut raw)
        .unwrap();
    for err in [
        other.try_acquire(1).unwrap_err(),
        other.rate().unwrap_err(),
        other
            .force_rate(RateMode::Overall, 1, Duration::from_secs(1))
            .unwrap_err(),
    ] {
        assert!(matches!(err, Error::WrongType { .. }), "{err}");
    }
}

/// A server busy with a slow script answers `BUSY` for a while: a waiting
/// acquisition rides that out until its deadline, as a lock's waiter does,
/// and a `try_acquire` (which never waits) reports it.
#[test]
fn a_busy_server_is_ridden_out_until_the_deadline() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "api", 10, Duration::from_secs(1));
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg("50")
        .query::<()>(&mut server.connection())
        .unwrap();
    let mut busy_conn = server.connection();
    let busy = std::thread::spawn(move || {
        redis::cmd("EVAL")
            .arg(
                "local s = redis.call('TIME') \
                 while true do \
                   local n = redis.call('TIME') \
                   if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > 800000 then return 1 end \
                 end",
            )
            .arg(0)
            .query::<i64>(&mut busy_conn)
    });
    let mut probe = server.connection();
    crate::support::eventually(Duration::from_secs(5), "the server answers BUSY", || {
        redis::cmd("PING")
            .query::<String>(&mut probe)
            .is_err_and(|err| err.code() == Some("BUSY"))
    });
    let refused = limiter.try_acquire(1).unwrap_err();
    assert!(refused.is_transient(), "{refused:?}");
    let started = Instant::now();
    let granted = limiter.try_acquire_for(1, Duration::from_secs(5));
    assert!(
        matches!(granted, Ok(true)),
        "{granted:?} after {:?}",
        started.elapsed()
    );
    busy.join().unwrap().unwrap();
}

/// The rate limiter needs nothing beyond the lock's ACL line
/// (docs/security.md): setting its rate, a waiting acquire, a refused one,
/// the permits left and deleting it work under a user limited to it.
#[test]
fn everything_works_under_a_user_limited_to_the_documented_acl() {
    let server = RedisServer::start();
    let url = crate::support::documented_acl_user(&server, "rate", "");
    let client = Client::open(&url).unwrap();
    let limiter = client.rate_limiter("acl").unwrap();
    assert!(limiter
        .set_rate(RateMode::Overall, 2, Duration::from_millis(200))
        .unwrap());
    assert!(limiter.rate().unwrap().is_some());
    limiter.acquire(2).unwrap();
    assert!(!limiter.try_acquire(1).unwrap());
    // Waits for the bucket to refill.
    assert!(limiter.try_acquire_for(1, Duration::from_secs(5)).unwrap());
    assert!(limiter.available_permits().unwrap() <= 2);
    assert!(limiter.delete().unwrap());
}

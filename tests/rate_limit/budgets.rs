//! The distributed rate limiter: shared budgets across real processes,
//! per-client budgets, the server as the only clock, sleeping instead of
//! polling, configuration that every process agrees on, key expiry and
//! layout. Bad input is in `rate_limit_errors.rs`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::across_topologies;
use crate::support::JoinWithin;
use crate::support::{client, eventually, overall_limiter, spawn_child};
use redbaton::{Client, Error, RateLimiter, RateMode};
use testkit::RedisServer;

/// The 3-process test: processes, threads each, permits per second, seconds.
const PROCESSES: usize = 3;
const THREADS: usize = 4;
const RATE: u64 = 50;
const WINDOW: Duration = Duration::from_secs(4);

/// This file's child-process roles (run by the binary's `child_entry`);
/// false for a role of another file.
pub(crate) fn run_child(role: &str, url: &str) -> bool {
    match role {
        "overall" => overall_worker(url),
        "blocked" => {
            let client = Client::open(url).unwrap();
            let limiter = client.rate_limiter("slow").unwrap();
            limiter.acquire(1).unwrap(); // the bucket's only permit
            println!("BLOCKING");
            let started = Instant::now();
            limiter.acquire(1).unwrap();
            println!("GRANTED {}", started.elapsed().as_millis());
        }
        _ => return false,
    }
    true
}

/// Waits for "go", then takes permits from `partner-api` on THREADS threads
/// for WINDOW, and prints how many it was granted.
fn overall_worker(url: &str) {
    let client = Client::open(url).unwrap();
    let limiter = client.rate_limiter("partner-api").unwrap();
    // Open a pooled connection and load the script before the start.
    limiter.available_permits().unwrap();
    let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
    println!("READY");
    // The parent sends the end of the window as UNIX microseconds, so that
    // all processes (on this one machine, and its Redis) share one window
    // that starts when the parent says go.
    let (_, end_us): (String, u128) = redis::cmd("BLPOP")
        .arg("go")
        .arg(30)
        .query(&mut raw)
        .unwrap();
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let end = Instant::now() + Duration::from_micros(end_us.saturating_sub(now_us) as u64);
    println!("GRANTED {}", take_until(&limiter, THREADS, end));
}

/// Takes single permits on `threads` threads until `end`. Returns the
/// permits granted by calls that returned before `end`: each of those was
/// granted by the server before `end` too, so the count can be held to the
/// rate over the window, however late a thread was scheduled.
fn take_until(limiter: &RateLimiter, threads: usize, end: Instant) -> u64 {
    thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut granted = 0;
                    while Instant::now() < end && limiter.try_acquire_until(1, end).unwrap() {
                        if Instant::now() < end {
                            granted += 1;
                        }
                    }
                    granted
                })
            })
            .collect();
        workers.into_iter().map(|w| w.joined()).sum()
    })
}

/// Script calls (`EVALSHA`, and `EVAL` should anything fall back to it) in
/// a `commands_since` diff; commands the scripts run inside are not counted.
fn script_calls(diff: &BTreeMap<String, u64>) -> u64 {
    diff.get("evalsha").copied().unwrap_or(0) + diff.get("eval").copied().unwrap_or(0)
}

#[test]
fn three_processes_of_four_threads_share_one_overall_budget() {
    let server = RedisServer::start();
    let setup = client(&server);
    let limiter = setup.rate_limiter("partner-api").unwrap();
    assert!(limiter
        .set_rate(RateMode::Overall, RATE, Duration::from_secs(1))
        .unwrap());

    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child("overall", &server))
        .collect();
    for child in &mut children {
        child.wait_for_line("READY", Duration::from_secs(30));
    }
    let before = server.command_calls();
    let mut raw = server.connection();
    // The bucket is full now (nobody took a permit yet), and every counted
    // grant happens before `end`: at most a bucket plus the rate over WINDOW.
    let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + WINDOW;
    redis::cmd("RPUSH")
        .arg("go")
        .arg(vec![end.as_micros().to_string(); PROCESSES])
        .query::<()>(&mut raw)
        .unwrap();

    let mut per_process = Vec::new();
    for child in &mut children {
        let lines = child.lines_with_prefix_until_exit("GRANTED", Duration::from_secs(60));
        assert_eq!(lines.len(), 1, "{lines:?}");
        per_process.push(lines[0].parse::<u64>().unwrap());
    }
    let calls = script_calls(&server.commands_since(&before));
    let total: u64 = per_process.iter().sum();
    let most = RATE * WINDOW.as_secs() + RATE; // the rate over the window + a full bucket
    let least = most * 9 / 10;
    println!("granted {total} (per process {per_process:?}), at most {most}; {calls} script calls");
    assert!(total <= most, "granted {total} > {most}: {per_process:?}");
    assert!(total >= least, "granted {total} < {least}: {per_process:?}");
    assert!(per_process.iter().all(|&n| n > 0), "{per_process:?}");
    // Twelve waiters may all wake for each new permit, but nobody polls.
    assert!(
        calls <= 30 * total,
        "{calls} script calls for {total} permits"
    );
}

#[test]
fn each_per_client_instance_gets_the_full_rate() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let (limiter_a, limiter_b) = (
        a.rate_limiter("mail").unwrap(),
        b.rate_limiter("mail").unwrap(),
    );
    assert!(limiter_a
        .set_rate(RateMode::PerClient, 20, Duration::from_secs(1))
        .unwrap());
    limiter_a.available_permits().unwrap();
    limiter_b.available_permits().unwrap();

    let window = Duration::from_secs(2);
    let end = Instant::now() + window;
    let (got_a, got_b) = thread::scope(|s| {
        let a = s.spawn(|| take_until(&limiter_a, 2, end));
        let b = s.spawn(|| take_until(&limiter_b, 2, end));
        (a.joined(), b.joined())
    });
    let most = 20 + 20 * window.as_secs();
    for got in [got_a, got_b] {
        assert!(
            got <= most && got >= most * 9 / 10,
            "{got_a} and {got_b}, each should be about {most}"
        );
    }
}

/// Reads a `MONITOR` stream: every command the server runs, including those
/// a script calls (`[0 lua]`).
struct Monitor {
    reader: BufReader<TcpStream>,
}

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK");
        Monitor { reader }
    }

    /// The next command seen: source (`lua` or a client address) and the
    /// quoted words. Panics after the read timeout.
    fn next(&mut self) -> (String, Vec<String>) {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let source = line
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(inside, _)| inside.split(' ').nth(1).unwrap_or("").to_owned())
            .unwrap_or_default();
        (source, quoted_words(&line))
    }
}

/// The `"..."` words of a MONITOR line, unescaped enough for our keys.
fn quoted_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => word.extend(chars.next()),
                '"' => break,
                c => word.push(c),
            }
        }
        words.push(word);
    }
    words
}

#[test]
fn the_acquire_script_reads_the_servers_clock_and_is_sent_no_client_time() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "api", 10, Duration::from_secs(1));
    limiter.available_permits().unwrap(); // loads the script: no NOSCRIPT below
    let mut monitor = Monitor::start(&server);

    limiter.try_acquire(3).unwrap();
    limiter.available_permits().unwrap();
    limiter.acquire(7).unwrap();
    assert!(!limiter.try_acquire(2).unwrap());
    limiter.delete().unwrap(); // a recognisable end of the stream

    let mut argvs = Vec::new();
    let mut time_reads = 0;
    loop {
        let (source, words) = monitor.next();
        let command = words.first().map(|w| w.to_lowercase()).unwrap_or_default();
        match command.as_str() {
            "evalsha" | "eval" => {
                let keys: usize = words[2].parse().unwrap();
                assert_eq!(keys, 3, "{words:?}");
                assert!(words[3].ends_with(":rate:config"), "{words:?}");
                argvs.push(words[3 + keys..].to_vec());
            }
            "time" if source == "lua" => time_reads += 1,
            // The delete's first `DEL`, sent by the client.
            "del" if source != "lua" => break,
            _ => {}
        }
    }
    // Each script call's ARGV is the permit count and nothing else: no
    // timestamp can reach the script, whatever the client's clock says.
    let expected: Vec<Vec<String>> = [["3"], ["0"], ["7"], ["2"]]
        .iter()
        .map(|a| a.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(argvs, expected);
    assert_eq!(time_reads, 4, "the script takes the time from the server");
}

/// A TCP proxy that holds every chunk a client sends for `delay` before
/// passing it on: requests reach Redis late, as from a distant client.
struct DelayingProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl DelayingProxy {
    fn start(upstream: u16, delay: Duration) -> DelayingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        thread::spawn(move || {
            for inbound in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut inbound) = inbound else { continue };
                let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut replies, mut back) =
                    (outbound.try_clone().unwrap(), inbound.try_clone().unwrap());
                thread::spawn(move || {
                    let _ = std::io::copy(&mut replies, &mut back);
                    let _ = back.shutdown(Shutdown::Both);
                });
                thread::spawn(move || {
                    let mut buf = [0; 16 * 1024];
                    while let Ok(n @ 1..) = inbound.read(&mut buf) {
                        thread::sleep(delay); // the situation under test
                        if outbound.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = outbound.shutdown(Shutdown::Both);
                });
            }
        });
        DelayingProxy { addr, stop }
    }
}

impl Drop for DelayingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
    }
}

#[test]
fn a_client_whose_requests_arrive_late_still_gets_only_the_configured_rate() {
    // Honest scope: the script takes no time from its caller (the MONITOR
    // test above proves that), so a late request is simply counted when it
    // arrives. This guards against the classic bug of a client-stamped
    // bucket, where a late, stale stamp rewinds `ts` and the next request
    // refills the same interval twice.
    let server = RedisServer::start();
    let delay = Duration::from_millis(40);
    let proxy = DelayingProxy::start(server.port(), delay);
    let near = client(&server);
    let far = Client::builder(format!("redis://{}/", proxy.addr))
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (near_limiter, far_limiter) = (
        near.rate_limiter("shared").unwrap(),
        far.rate_limiter("shared").unwrap(),
    );
    near_limiter
        .set_rate(RateMode::Overall, 20, Duration::from_secs(1))
        .unwrap();
    far_limiter.available_permits().unwrap();

    let window = Duration::from_secs(2);
    // A full bucket plus the rate over the window.
    let most = 20 + 20 * window.as_secs();
    let least = most * 9 / 10;

    // Alone, the late client gets the configured rate.
    let got_far_alone = take_until(&far_limiter, 2, Instant::now() + window);
    assert!(
        got_far_alone <= most && got_far_alone >= least,
        "the late client alone got {got_far_alone}, expected {least}..={most}"
    );

    // Together, the two get the configured rate between them. (Not fairly:
    // a refused caller retries when the permit is due, and the near client's
    // retry arrives first, so it takes nearly all; see docs/rate-limiter.md.)
    near_limiter.delete().unwrap();
    near_limiter
        .set_rate(RateMode::Overall, 20, Duration::from_secs(1))
        .unwrap();
    let end = Instant::now() + window;
    let (got_near, got_far) = thread::scope(|s| {
        let near = s.spawn(|| take_until(&near_limiter, 2, end));
        let far = s.spawn(|| take_until(&far_limiter, 2, end));
        (near.joined(), far.joined())
    });
    let total = got_near + got_far;
    println!("late client alone {got_far_alone}; together: near {got_near} + late {got_far}");
    assert!(
        total <= most && total >= least,
        "near {got_near} + late {got_far}, expected {least}..={most}"
    );
}

#[test]
fn a_blocked_acquire_sends_a_few_script_calls_per_permit_not_a_poll() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "paced", 10, Duration::from_secs(1));
    limiter.available_permits().unwrap();

    // 10 from the full bucket, then 15 more at 10/s.
    let before = server.command_calls();
    let started = Instant::now();
    for _ in 0..25 {
        limiter.acquire(1).unwrap();
    }
    let took = started.elapsed();
    let calls = script_calls(&server.commands_since(&before));
    assert!(
        took >= Duration::from_millis(1_400),
        "25 permits at 10/s in {took:?}"
    );
    assert!(calls <= 2 * 25 + 3, "{calls} script calls for 25 permits");

    // The bucket is empty: 10 at once need a second; one refusal, one sleep.
    let before = server.command_calls();
    let started = Instant::now();
    limiter.acquire(10).unwrap();
    let took = started.elapsed();
    let calls = script_calls(&server.commands_since(&before));
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(calls <= 3, "{calls} script calls for one acquire(10)");

    // Four threads competing for 20 permits: a wake-up per waiter per permit
    // at most.
    let before = server.command_calls();
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5 {
                    limiter.acquire(1).unwrap();
                }
            });
        }
    });
    let calls = script_calls(&server.commands_since(&before));
    assert!(
        calls <= 5 * 20,
        "{calls} script calls for 20 permits on 4 threads"
    );
}

#[test]
fn set_rate_is_first_writer_wins_across_clients() {
    let server = RedisServer::start();
    let writers = 8;
    let barrier = Barrier::new(writers);
    let results: Vec<(u64, bool)> = thread::scope(|s| {
        let handles: Vec<_> = (1..=writers as u64)
            .map(|permits| {
                let (server, barrier) = (&server, &barrier);
                s.spawn(move || {
                    let limiter = client(server).rate_limiter("first").unwrap();
                    limiter.available_permits().unwrap_err(); // connect first
                    barrier.wait();
                    let wrote = limiter
                        .set_rate(RateMode::Overall, permits, Duration::from_secs(1))
                        .unwrap();
                    (permits, wrote)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.joined()).collect()
    });
    let winners: Vec<u64> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
    assert_eq!(winners.len(), 1, "{results:?}");

    let other = client(&server).rate_limiter("first").unwrap();
    let rate = other.rate().unwrap().unwrap();
    assert_eq!(rate.permits, winners[0]);
    assert_eq!(rate.mode, RateMode::Overall);
    assert_eq!(rate.per, Duration::from_secs(1));
    assert!(!other
        .set_rate(RateMode::PerClient, 99, Duration::from_millis(5))
        .unwrap());
    assert_eq!(other.rate().unwrap(), Some(rate));
}

#[test]
fn force_rate_replaces_the_rate_and_a_process_blocked_on_the_old_one_sees_it() {
    let server = RedisServer::start();
    let admin = client(&server);
    let limiter = overall_limiter(&admin, "slow", 1, Duration::from_secs(3600));

    let mut child = spawn_child("blocked", &server);
    child.wait_for_line("BLOCKING", Duration::from_secs(30));
    thread::sleep(Duration::from_millis(300)); // let it sleep on the old rate
    limiter
        .force_rate(RateMode::Overall, 100, Duration::from_secs(1))
        .unwrap();
    let forced = Instant::now();
    child.wait_for_line("GRANTED", Duration::from_secs(5));
    let seen_after = forced.elapsed();
    assert!(
        seen_after < Duration::from_millis(1_500),
        "the blocked process took {seen_after:?} to see the new rate"
    );
    let rate = limiter.rate().unwrap().unwrap();
    assert_eq!((rate.permits, rate.per), (100, Duration::from_secs(1)));

    // Switching modes takes effect too: this client now has its own bucket.
    limiter
        .force_rate(RateMode::PerClient, 5, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(limiter.available_permits().unwrap(), 5);
}

across_topologies! {
    but_masters;
fn try_acquire_takes_what_is_there_and_available_permits_counts_it(deployment) {
    let client = deployment.client();
    let limiter = overall_limiter(&client, "hourly", 10, Duration::from_secs(3600));
    assert_eq!(limiter.available_permits().unwrap(), 10);
    assert!(limiter.try_acquire(4).unwrap());
    assert_eq!(limiter.available_permits().unwrap(), 6);
    assert!(!limiter.try_acquire(7).unwrap());
    assert_eq!(
        limiter.available_permits().unwrap(),
        6,
        "a refusal takes nothing"
    );

    // Seven more need six minutes: try_acquire_for gives up at once.
    let started = Instant::now();
    assert!(!limiter.try_acquire_for(7, Duration::from_secs(2)).unwrap());
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(limiter.try_acquire_for(6, Duration::from_secs(2)).unwrap());
}
}

#[test]
fn try_acquire_for_waits_for_a_permit_that_comes_in_time() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "tenth", 10, Duration::from_secs(1));
    assert!(limiter.try_acquire(10).unwrap());
    let started = Instant::now();
    assert!(limiter.try_acquire_for(1, Duration::from_secs(1)).unwrap());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_millis(600),
        "{took:?} for one permit at 10/s"
    );
}

#[test]
fn a_partial_refill_never_fills_the_bucket_past_its_capacity() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = overall_limiter(&client, "brim", 10, Duration::from_secs(1));
    assert!(limiter.try_acquire(1).unwrap());
    assert_eq!(limiter.available_permits().unwrap(), 9);
    // Half the interval refills five permits, of which one fits.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        limiter.available_permits().unwrap(),
        10,
        "over the capacity"
    );
    assert!(limiter.try_acquire(10).unwrap());
    assert_eq!(
        limiter.available_permits().unwrap(),
        0,
        "more than the capacity was taken"
    );
}

#[test]
fn a_bucket_lives_its_time_to_fill_plus_a_second() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut raw = server.connection();
    // 3 of 10 per 3 s: full again in 900 ms, so the state lives 1.9 s.
    let limiter = overall_limiter(&client, "lifetime", 10, Duration::from_secs(3));
    let taken_at = Instant::now();
    assert!(limiter.try_acquire(3).unwrap());
    let pttl: i64 = redis::cmd("PTTL")
        .arg("redbaton:{lifetime}:rate:overall")
        .query(&mut raw)
        .unwrap();
    // Rounded up: Redis counts a started millisecond as gone.
    let since = i64::try_from(taken_at.elapsed().as_millis()).unwrap() + 1;
    assert!(
        pttl >= 1_900 - since && pttl <= 1_900,
        "bucket PTTL {pttl} ({since} ms after the take), not 900 + 1000"
    );
}

#[test]
fn idle_bucket_state_expires_but_the_configuration_stays_until_deleted() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut raw = server.connection();
    let limiter = overall_limiter(&client, "idle", 10, Duration::from_millis(200));
    let taken_at = Instant::now();
    assert!(limiter.try_acquire(10).unwrap());

    let bucket = "redbaton:{idle}:rate:overall";
    let config = "redbaton:{idle}:rate:config";
    let pttl: i64 = redis::cmd("PTTL").arg(bucket).query(&mut raw).unwrap();
    // It lives its time to fill (200 ms) plus a second, less the time since
    // it was written.
    // Rounded up: Redis counts a started millisecond as gone.
    let since = i64::try_from(taken_at.elapsed().as_millis()).unwrap() + 1;
    assert!(
        pttl >= 200 + 1_000 - since && pttl <= 200 + 1_000,
        "bucket PTTL {pttl} ({since} ms after the take)"
    );
    let ttl: i64 = redis::cmd("PTTL").arg(config).query(&mut raw).unwrap();
    assert_eq!(ttl, -1, "the configuration must not expire");

    eventually(Duration::from_secs(5), "the idle bucket to expire", || {
        !redis::cmd("EXISTS")
            .arg(bucket)
            .query::<bool>(&mut raw)
            .unwrap()
    });
    assert!(limiter.rate().unwrap().is_some());
    assert_eq!(
        limiter.available_permits().unwrap(),
        10,
        "a missing bucket is full"
    );

    assert!(limiter.try_acquire(1).unwrap());
    assert!(limiter.delete().unwrap());
    let left: u64 = redis::cmd("EXISTS")
        .arg(&[bucket, config])
        .query(&mut raw)
        .unwrap();
    assert_eq!(left, 0);
    assert!(matches!(
        limiter.try_acquire(1).unwrap_err(),
        Error::RateNotConfigured { .. }
    ));
    assert!(!limiter.delete().unwrap());
}

#[test]
fn all_keys_of_a_limiter_hash_to_one_cluster_slot_and_none_is_a_lock_key() {
    let server = RedisServer::start();
    let name = "partner {api}: ünïcode";
    let client = client(&server);
    let limiter = client.rate_limiter(name).unwrap();
    limiter
        .set_rate(RateMode::Overall, 10, Duration::from_secs(1))
        .unwrap();
    limiter.acquire(1).unwrap();
    limiter
        .force_rate(RateMode::PerClient, 10, Duration::from_secs(1))
        .unwrap();
    limiter.acquire(1).unwrap();
    drop(client.lock(name).unwrap().lock().unwrap());

    let mut raw = server.connection();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut raw).unwrap();
    keys.sort();
    let rate_keys: Vec<&String> = keys.iter().filter(|k| k.contains(":rate:")).collect();
    assert_eq!(
        rate_keys.len(),
        3,
        "config, overall and this client's bucket: {keys:?}"
    );

    let cluster = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let mut node = cluster.connection();
    let slots: Vec<i64> = rate_keys
        .iter()
        .map(|key| {
            redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key.as_str())
                .query(&mut node)
                .unwrap()
        })
        .collect();
    assert!(
        slots.windows(2).all(|w| w[0] == w[1]),
        "{rate_keys:?} -> {slots:?}"
    );
}

#[test]
fn the_limiter_keeps_working_after_script_flush() {
    let server = RedisServer::start();
    let client = client(&server);
    let limiter = client.rate_limiter("flushed").unwrap();
    assert!(limiter
        .set_rate(RateMode::Overall, 10, Duration::from_secs(3600))
        .unwrap());
    assert!(limiter.try_acquire(1).unwrap());
    let mut raw = server.connection();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut raw)
        .unwrap();
    assert!(limiter.try_acquire(1).unwrap());
    assert_eq!(limiter.available_permits().unwrap(), 8);
    limiter
        .force_rate(RateMode::Overall, 20, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(limiter.rate().unwrap().unwrap().permits, 20);
}

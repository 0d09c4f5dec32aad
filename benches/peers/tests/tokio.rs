//! The recipe for calling redbaton from tokio (the crate docs' "From async
//! code"), under a real multi-thread runtime: the lock is taken and
//! released on a blocking-pool thread (a guard belongs to its thread), the
//! async critical section runs on the runtime meanwhile, and no runtime
//! worker ever blocks.
//!
//! ```text
//! cargo test --manifest-path benches/peers/Cargo.toml --test tokio
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redbaton::{Client, Error, Lock};

/// Runs `work` while this process holds `lock`: the lock is taken and kept
/// on a thread of tokio's blocking pool (a guard belongs to the thread
/// that took it), which releases it once `work` is done, or dropped.
async fn with_lock_async<F: Future>(lock: Lock, work: F) -> Result<F::Output, Error> {
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || -> Result<(), Error> {
        let guard = lock.lock()?;
        if held_tx.send(()).is_err() {
            return guard.unlock(); // the caller is gone
        }
        // Until the async work ends: its end drops the sender.
        let _ = done_rx.recv();
        guard.unlock()
    });
    if held_rx.await.is_err() {
        // The holder thread ended without the lock: its error says why.
        holder.await.expect("the lock thread panicked")?;
        unreachable!("a lock thread that did not lock returned an error");
    }
    let output = work.await;
    drop(done_tx);
    holder.await.expect("the lock thread panicked")?;
    Ok(output)
}

#[test]
fn async_tasks_take_turns_without_blocking_the_runtime() {
    let redis = testkit::RedisServer::start();
    let client = Client::open(&redis.url()).unwrap();
    let lock = client.lock("tokio-recipe").unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    const TASKS: usize = 12;
    const ROUNDS: usize = 5;
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(AtomicUsize::new(0));
    let ticks = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    runtime.block_on(async {
        // A ticker that only runs if the runtime's workers are free.
        let ticking = Arc::clone(&ticks);
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticking.fetch_add(1, Ordering::SeqCst);
            }
        });
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (lock, inside, most_inside, counter) = (
                    lock.clone(),
                    Arc::clone(&inside),
                    Arc::clone(&most_inside),
                    Arc::clone(&counter),
                );
                tokio::spawn(async move {
                    for _ in 0..ROUNDS {
                        with_lock_async(lock.clone(), async {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most_inside.fetch_max(now, Ordering::SeqCst);
                            // A read-modify-write across an await point:
                            // exact only under mutual exclusion.
                            let seen = counter.load(Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            counter.store(seen + 1, Ordering::SeqCst);
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                        .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        ticker.abort();
    });
    let elapsed = started.elapsed();
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
    assert_eq!(most_inside.load(Ordering::SeqCst), 1);
    // Every critical section sleeps 2 ms, so the run took at least
    // TASKS * ROUNDS * 2 ms; a ticker every 5 ms that the waiting tasks
    // never held up ticked for most of it.
    let expected = elapsed.as_millis() as usize / 5;
    let ticked = ticks.load(Ordering::SeqCst);
    assert!(
        ticked * 2 >= expected,
        "the runtime was blocked: {ticked} ticks in {elapsed:?}"
    );
    assert!(!lock.is_locked().unwrap());
}

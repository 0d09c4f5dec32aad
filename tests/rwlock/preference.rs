//! Writer preference: a waiting writer is not starved by readers coming
//! and going, and a writer that gives up stops holding readers back at
//! once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::across_topologies;
use crate::support::{eventually, JoinWithin};
use crate::{rw_key, waiting_writers};

across_topologies! {
    but_masters;
    /// Four reader threads keep the lock read-held without a gap (each
    /// holds 20 ms, and they overlap); a writer of another client still
    /// gets it within 1.5 s, alone, and the readers go on after it.
    fn a_waiting_writer_is_not_starved_by_a_stream_of_readers(deployment) {
        let readers_client = deployment.client();
        let lock = readers_client.rw_lock("stream").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let inside = Arc::new(AtomicUsize::new(0));
        let reads = Arc::new(AtomicUsize::new(0));
        let writing = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..4)
            .map(|i| {
                let (lock, stop, inside, reads, writing, overlaps) = (
                    lock.clone(),
                    Arc::clone(&stop),
                    Arc::clone(&inside),
                    Arc::clone(&reads),
                    Arc::clone(&writing),
                    Arc::clone(&overlaps),
                );
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(5 * i));
                    while !stop.load(Ordering::SeqCst) {
                        let guard = lock.try_read_for(Duration::from_secs(20)).unwrap().expect("read");
                        inside.fetch_add(1, Ordering::SeqCst);
                        if writing.load(Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        thread::sleep(Duration::from_millis(20));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        reads.fetch_add(1, Ordering::SeqCst);
                        guard.unlock().unwrap();
                    }
                })
            })
            .collect();
        eventually(Duration::from_secs(10), "the stream of readers", || reads.load(Ordering::SeqCst) >= 20);

        let writer_client = deployment.client();
        let writer = writer_client.rw_lock("stream").unwrap();
        let started = Instant::now();
        let guard = writer.try_write_for(Duration::from_secs(10)).unwrap().expect("not starved");
        let waited = started.elapsed();
        writing.store(true, Ordering::SeqCst);
        assert_eq!(inside.load(Ordering::SeqCst), 0, "a reader is inside with the writer");
        let reads_before = reads.load(Ordering::SeqCst);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(reads.load(Ordering::SeqCst), reads_before, "a reader finished while the writer held");
        writing.store(false, Ordering::SeqCst);
        guard.unlock().unwrap();
        // Woken by the last reader's baton; without it the writer would
        // look again only after a 2 s park, and without its place the
        // readers would keep it out for the whole 10 s.
        assert!(waited < Duration::from_millis(1_500), "the writer waited {waited:?}");
        eventually(Duration::from_secs(10), "readers after the writer", || {
            reads.load(Ordering::SeqCst) >= reads_before + 8
        });
        stop.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.joined();
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    }
}

across_topologies! {
    but_masters;
    /// A writer that waits behind a reader keeps fresh readers out; when it
    /// gives up at its deadline, a reader parked behind it gets in at once
    /// (well before its place would have ended).
    fn a_writer_that_gives_up_lets_waiting_readers_in_at_once(deployment) {
        let holder = deployment.client();
        let held = holder.rw_lock("patience").unwrap().read().unwrap();
        // Long parks: only a baton can wake the reader early.
        let writer_client = deployment.builder().max_park(Duration::from_secs(5)).build().unwrap();
        let writer_lock = writer_client.rw_lock("patience").unwrap();
        let writer = thread::spawn(move || {
            let got = writer_lock.try_write_for(Duration::from_secs(1)).unwrap();
            assert!(got.is_none(), "a reader holds the lock all along");
            Instant::now()
        });
        let mut raw = deployment.server_for(&rw_key("patience", "writers")).connection();
        eventually(Duration::from_secs(10), "the writer's place", || waiting_writers(&mut raw, "patience") == 1);

        let reader_client = deployment.builder().max_park(Duration::from_secs(10)).build().unwrap();
        let reader_lock = reader_client.rw_lock("patience").unwrap();
        assert!(reader_lock.try_read().unwrap().is_none(), "fresh readers wait behind the writer");
        let reader = thread::spawn(move || {
            let guard = reader_lock.try_read_for(Duration::from_secs(20)).unwrap();
            (guard.is_some(), Instant::now())
        });
        let gave_up_at = writer.joined();
        let (read, read_at) = reader.joined();
        assert!(read, "the reader got in");
        assert!(read_at + Duration::from_millis(20) >= gave_up_at, "not before the writer left");
        let late = read_at.saturating_duration_since(gave_up_at);
        // The place would have lasted 5.5 s from the writer's last attempt.
        assert!(late < Duration::from_millis(700), "the reader got in {late:?} after the writer gave up");
        assert_eq!(waiting_writers(&mut raw, "patience"), 0, "the writer left its place");
        held.unlock().unwrap();
    }
}

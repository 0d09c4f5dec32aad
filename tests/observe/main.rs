//! Observing a client: the loss signal of guards and permits
//! (`signal`), and the event hook of `ClientBuilder::on_event`
//! (`events`). One binary, one module per area; every test starts its
//! own `redis-server`.

#[path = "../support/mod.rs"]
mod support;

#[cfg(any(feature = "cluster", feature = "sentinel", feature = "redlock"))]
mod deployments;
mod events;
mod signal;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How many `log` records so far contain each of the watched phrases; the
/// logger is the binary's, installed once.
struct Counting;

/// What a test counts in the log.
const WATCHED: &[&str] = &["event hook panicked"];

static COUNTS: [AtomicUsize; 1] = [AtomicUsize::new(0)];

impl log::Log for Counting {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let text = record.args().to_string();
        for (phrase, count) in WATCHED.iter().zip(&COUNTS) {
            if text.contains(phrase) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn flush(&self) {}
}

/// How many log records so far contained `phrase` (one of `WATCHED`).
pub(crate) fn logged(phrase: &str) -> usize {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        log::set_logger(&Counting).expect("the only logger of this binary");
        log::set_max_level(log::LevelFilter::Warn);
    });
    let index = WATCHED
        .iter()
        .position(|w| *w == phrase)
        .expect("a watched phrase");
    COUNTS[index].load(Ordering::SeqCst)
}

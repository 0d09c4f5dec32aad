//! Holds the peer benchmarks (`lock.rs`, `redlock.rs`, `sync.rs`); no library code.

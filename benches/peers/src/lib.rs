//! Holds the peer benchmarks (`sync.rs`); no library code.

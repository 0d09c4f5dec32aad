//! Test support for redbaton's integration tests, examples and benches.
//!
//! Everything here talks to real processes: [`RedisServer`] owns a throwaway
//! `redis-server` child bound to a free loopback port, [`RedisCluster`] a
//! small Redis Cluster of them, [`RedisSentinels`] a master with replicas
//! and sentinels, [`FaultProxy`] a TCP proxy that loses replies
//! or holds requests up, and [`ChildProcess`]
//! runs a second real process (usually the current test binary re-executed
//! on one `#[ignore]`d test) whose stdout is read line by line.
//!
//! This crate is test support, so misuse and environment failures panic with
//! a message meant for the person reading the test output, except where a
//! `try_` variant says otherwise. Every wait is bounded by a deadline so a
//! broken server or child fails the test instead of hanging it.
//!
//! The process helpers rely on POSIX signals and are therefore Unix-only.

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod acl;
mod child;
mod cluster;
mod commandstats;
mod demo;
mod launch;
mod process;
mod proxy;
mod sentinel;
mod server;

pub use acl::{ungranted_user, untracked_user};
pub use child::ChildProcess;
pub use cluster::{RedisCluster, SlotMigration, SLOTS};
pub use commandstats::{diff_calls, parse_commandstats};
pub use demo::DemoRedis;
pub use launch::{server_binary, server_version, SERVER_VAR};
pub use process::pid_exists;
pub use proxy::FaultProxy;
pub use sentinel::{Passwords, RedisSentinels};
pub use server::RedisServer;

//! The Redis that examples and benches run against.

use crate::launch::{NOT_FOUND, NOT_FOUND_FOR_EXAMPLES};
use crate::RedisServer;

/// `REDIS_URL` when it is set, otherwise a throwaway `redis-server` that
/// lives as long as this value.
#[derive(Debug)]
pub struct DemoRedis {
    /// Where to connect.
    pub url: String,
    /// The throwaway server, if one was started.
    pub server: Option<RedisServer>,
}

impl DemoRedis {
    /// Uses `REDIS_URL`, or starts a throwaway server from PATH.
    ///
    /// # Errors
    /// The one-line hint to install `redis-server` (or set `REDIS_URL`) to
    /// run the program, or why the server did not start.
    pub fn from_env() -> Result<DemoRedis, String> {
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Ok(DemoRedis { url, server: None });
        }
        let server = RedisServer::try_start().map_err(|err| {
            if err == NOT_FOUND {
                NOT_FOUND_FOR_EXAMPLES.to_owned()
            } else {
                err
            }
        })?;
        Ok(DemoRedis {
            url: server.url(),
            server: Some(server),
        })
    }

    /// The body of an example's `main`: prints `title` and which Redis it
    /// uses, runs `demo` against it, and turns the outcome into the exit
    /// code (failure when it could not start, returned `false` — a wrong
    /// result — or failed).
    pub fn run_demo<E: std::fmt::Display>(
        title: &str,
        demo: impl FnOnce(&str) -> Result<bool, E>,
    ) -> std::process::ExitCode {
        use std::process::ExitCode;
        // Keeps a throwaway server alive until the demo ends.
        let redis = match DemoRedis::from_env() {
            Ok(redis) => redis,
            Err(message) => {
                eprintln!("{message}");
                return ExitCode::FAILURE;
            }
        };
        println!("{title} (Redis: {})", redis.describe());
        match demo(&redis.url) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        }
    }

    /// A line saying which Redis this is, for the program's output.
    pub fn describe(&self) -> String {
        match &self.server {
            Some(server) => format!(
                "a throwaway redis-server on port {} (set REDIS_URL to use yours)",
                server.port()
            ),
            None => "REDIS_URL".to_owned(),
        }
    }
}

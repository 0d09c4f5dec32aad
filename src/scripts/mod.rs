//! The server-side half of the protocol: one Lua script per operation, each
//! run atomically by Redis. The `.lua` files document their KEYS, ARGV and
//! replies; [`redis::Script`] sends them with `EVALSHA` and reloads them when
//! the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

/// The fencing-token helper, prepended to the scripts that need it.
macro_rules! with_next_fence {
    ($file:literal) => {
        concat!(include_str!("next_fence.lua"), include_str!($file))
    };
}

/// Take, re-enter, or report the holder's remaining lease.
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_next_fence!("acquire.lua")));

/// The last release of a holder, handing the lock to a local waiter.
pub(crate) static HANDOFF: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_next_fence!("handoff.lua")));

/// Undo one level; the last level deletes the lock and pushes the baton.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("release.lua")));

/// Administrative release of whoever holds the lock.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("force_unlock.lua")));

/// Owner-checked `PEXPIRE`: the watchdog's renewal and `guard.extend()`.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("renew.lua")));

/// Atomic read of owner, depth, fence and remaining lease.
pub(crate) static HOLDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("holder.lua")));

/// Take permits from a rate limiter's bucket, or say how long until they
/// exist; reads the server's clock, never the client's.
pub(crate) static RATE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rate_acquire.lua")));

/// Write a rate limiter's configuration, when absent or unconditionally.
pub(crate) static RATE_CONFIG: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rate_config.lua")));

/// Every script with its file name and source, for error messages.
fn all() -> [(&'static str, &'static LazyLock<Script>, &'static str); 8] {
    [
        ("acquire.lua", &ACQUIRE, with_next_fence!("acquire.lua")),
        ("handoff.lua", &HANDOFF, with_next_fence!("handoff.lua")),
        ("release.lua", &RELEASE, include_str!("release.lua")),
        (
            "force_unlock.lua",
            &FORCE_UNLOCK,
            include_str!("force_unlock.lua"),
        ),
        ("renew.lua", &RENEW, include_str!("renew.lua")),
        ("holder.lua", &HOLDER, include_str!("holder.lua")),
        (
            "rate_acquire.lua",
            &RATE_ACQUIRE,
            include_str!("rate_acquire.lua"),
        ),
        (
            "rate_config.lua",
            &RATE_CONFIG,
            include_str!("rate_config.lua"),
        ),
    ]
}

/// Names the command a script error points at. Redis reports an error
/// inside a script as "... script: <sha>, on @user_script:<line>." without
/// naming the command (an ACL refusal, for one); the line of our own source
/// does.
pub(crate) fn command_in_error(message: &str) -> Option<String> {
    let (_, after) = message.split_once("script: ")?;
    let (sha, after) = after.split_once(',')?;
    let line: usize = after
        .split_once("@user_script:")?
        .1
        .trim_end_matches('.')
        .trim()
        .parse()
        .ok()?;
    let (file, _, source) = all()
        .into_iter()
        .find(|(_, script, _)| script.get_hash() == sha.trim())?;
    let text = source.lines().nth(line.checked_sub(1)?)?;
    let command = text.split_once("redis.call('")?.1.split_once('\'')?.0;
    // Line numbers count the prepended helper too.
    Some(format!(
        "{command} in {file} (line {line} of the script as sent)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_error_is_traced_to_its_command() {
        let line = with_next_fence!("acquire.lua")
            .lines()
            .position(|l| l.contains("redis.call('HSET'"))
            .unwrap()
            + 1;
        let message = format!(
            "The user executing the script can't run this command or subcommand script: {}, on @user_script:{line}.",
            ACQUIRE.get_hash()
        );
        assert_eq!(
            command_in_error(&message),
            Some(format!(
                "HSET in acquire.lua (line {line} of the script as sent)"
            ))
        );
        assert_eq!(command_in_error("ERR something else"), None);
    }
}

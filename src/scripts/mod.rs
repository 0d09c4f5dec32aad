//! The server-side half of the protocol: one Lua script per operation, each
//! run atomically by Redis. The `.lua` files document their KEYS, ARGV and
//! replies; [`redis::Script`] sends them with `EVALSHA` and reloads them when
//! the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod reply;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

/// Declares every script once: its `static`, and its entry in the table
/// that traces errors back to a file and line. A script may list helpers
/// from `lib/` that are prepended to it (line numbers in Redis's errors
/// count them too).
macro_rules! scripts {
    ($(
        $(#[$doc:meta])*
        $name:ident => $file:literal $(with [$($lib:literal),+])?;
    )+) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: LazyLock<Script> =
                LazyLock::new(|| Script::new(scripts!(@source $file $(, $($lib),+)?)));
        )+

        /// Every script with its file name and source as sent, for error
        /// messages.
        fn all() -> Vec<(&'static str, &'static LazyLock<Script>, &'static str)> {
            vec![$(($file, &$name, scripts!(@source $file $(, $($lib),+)?))),+]
        }
    };
    (@source $file:literal $(, $lib:literal)*) => {
        concat!($(include_str!($lib),)* include_str!($file))
    };
}

scripts! {
    /// Take, re-enter, or report the holder's remaining lease.
    ACQUIRE => "lock/acquire.lua"
        with ["lib/next_fence.lua", "lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua"];
    /// Take several locks of one slot at once, all or none (the multi-lock).
    ACQUIRE_MANY => "lock/acquire_many.lua"
        with ["lib/next_fence.lua", "lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua"];
    /// The last release of a holder, handing the lock to a local waiter.
    HANDOFF => "lock/handoff.lua" with ["lib/next_fence.lua"];
    /// Undo one level; the last level deletes the lock and pushes the baton.
    RELEASE => "lock/release.lua"
        with ["lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua", "lib/next_fence.lua", "lib/grant_message.lua", "lib/grant.lua"];
    /// A Redlock quorum's releases of a multi-lock's names on one master,
    /// each as `RELEASE` does it.
    RELEASE_MANY => "lock/release_many.lua"
        with ["lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua"];
    /// Undo the ownership a request whose reply was lost may have created.
    RELEASE_REQUEST => "lock/release_request.lua" with ["lib/baton.lua"];
    /// A plain lock's waiter that stops waiting takes its grant off.
    WITHDRAW => "lock/withdraw.lua";
    /// Administrative release of whoever holds the lock.
    FORCE_UNLOCK => "lock/force_unlock.lua" with ["lib/baton.lua"];
    /// Owner-checked, never-shortening `PEXPIRE`: the watchdog's renewal and
    /// `guard.extend()`.
    RENEW => "lock/renew.lua" with ["lib/lease.lua"];
    /// Atomic read of owner, depth, fence and remaining lease.
    HOLDER => "lock/holder.lua";
    /// A quorum's common fencing token, proposed to one master.
    ADOPT_FENCE => "lock/adopt_fence.lua";
    /// The fair lock: take it in arrival order, or keep a place in its queue.
    FAIR_ACQUIRE => "fair/acquire.lua"
        with ["lib/next_fence.lua", "lib/lease.lua", "lib/fair_queue.lua", "lib/baton.lua"];
    /// The fair lock's release: wakes (or grants the lock to) the head of
    /// its queue, or names the head to wake.
    FAIR_RELEASE => "fair/release.lua"
        with ["lib/lease.lua", "lib/fair_queue.lua", "lib/baton.lua", "lib/next_fence.lua", "lib/grant_message.lua", "lib/grant.lua"];
    /// The last release of a fair lock's holder, handing it to a waiter of
    /// the same process that is the head of the queue.
    FAIR_HANDOFF => "fair/handoff.lua" with ["lib/next_fence.lua", "lib/fair_queue.lua"];
    /// The fair lock's undo of a lost request, naming the head to wake.
    FAIR_RELEASE_REQUEST => "fair/release_request.lua" with ["lib/fair_queue.lua"];
    /// The fair lock's administrative release, naming the head to wake.
    FAIR_FORCE_UNLOCK => "fair/force_unlock.lua" with ["lib/fair_queue.lua"];
    /// A fair lock's waiter that gave up leaves the queue.
    FAIR_LEAVE => "fair/leave.lua" with ["lib/fair_queue.lua"];
    /// Wakes the one fair-lock waiter a release named, on its own list
    /// (and on the head's list when it may park there).
    FAIR_WAKE => "fair/wake.lua" with ["lib/baton.lua"];
    /// A count-down latch's new round.
    LATCH_SET_COUNT => "latch/set_count.lua" with ["lib/latch.lua"];
    /// One count down; zero opens the latch and wakes every waiter.
    LATCH_COUNT_DOWN => "latch/count_down.lua" with ["lib/latch.lua"];
    /// Whether a latch is open, passing the wake-up token on.
    LATCH_WAIT => "latch/wait.lua" with ["lib/latch.lua"];
    /// Take permits from a rate limiter's bucket, or say how long until they
    /// exist; reads the server's clock, never the client's.
    RATE_ACQUIRE => "rate/acquire.lua";
    /// Write a rate limiter's configuration, when absent or unconditionally.
    RATE_CONFIG => "rate/config.lua";
    /// Read-write lock: take or re-enter a read hold, or say how long to wait.
    RW_READ => "rwlock/read.lua" with ["lib/rw.lua", "lib/baton.lua"];
    /// Read-write lock: take or re-enter the write hold, keeping a place
    /// among the waiting writers when refused; refuse an upgrade.
    RW_WRITE => "rwlock/write.lua" with ["lib/rw.lua", "lib/next_fence.lua", "lib/lease.lua"];
    /// Read-write lock: release one read guard; the last reader grants the
    /// write hold to a waiting writer, or wakes one.
    RW_RELEASE_READ => "rwlock/release_read.lua"
        with ["lib/rw.lua", "lib/baton.lua", "lib/next_fence.lua", "lib/grant_message.lua", "lib/write_grant.lua"];
    /// Read-write lock: release one write guard; the last grants or wakes
    /// readers, or grants the write hold to a waiting writer, or wakes one.
    RW_RELEASE_WRITE => "rwlock/release_write.lua"
        with ["lib/rw.lua", "lib/lease.lua", "lib/baton.lua", "lib/next_fence.lua", "lib/grant_message.lua", "lib/write_grant.lua"];
    /// Read-write lock: a waiting writer that gives up leaves its place.
    RW_WITHDRAW => "rwlock/withdraw.lua" with ["lib/rw.lua", "lib/baton.lua"];
    /// Read-write lock: the watchdog's owner-checked, never-shortening
    /// renewal of a read hold (write holds renew with `RENEW`).
    RW_RENEW_READ => "rwlock/renew_read.lua" with ["lib/rw.lua"];
    /// Read-write lock: free what a request whose reply was lost took.
    RW_UNDO => "rwlock/undo.lua" with ["lib/rw.lua", "lib/baton.lua"];
    /// Read-write lock: take or re-enter the upgradable read, or say how
    /// long to wait.
    RW_UPGRADABLE => "rwlock/upgradable.lua" with ["lib/rw.lua", "lib/lease.lua"];
    /// Read-write lock: release one upgradable guard; the last wakes who
    /// waits for it, or grants the write hold to a waiting writer.
    RW_RELEASE_UPGRADABLE => "rwlock/release_upgradable.lua"
        with ["lib/rw.lua", "lib/lease.lua", "lib/baton.lua", "lib/next_fence.lua", "lib/grant_message.lua", "lib/write_grant.lua"];
    /// Read-write lock: the upgradable reader takes the write hold once the
    /// other readers left, or marks that it waits.
    RW_UPGRADE => "rwlock/upgrade.lua" with ["lib/rw.lua", "lib/next_fence.lua"];
    /// Read-write lock: an upgrade that gives up takes its mark off.
    RW_CANCEL_UPGRADE => "rwlock/cancel_upgrade.lua" with ["lib/baton.lua"];
    /// Set a semaphore's total of permits, unless one is in force.
    SEM_SET => "semaphore/set.lua" with ["lib/permits.lua"];
    /// Add permits to a semaphore's total, or take them off it.
    SEM_ADJUST => "semaphore/adjust.lua" with ["lib/permits.lua"];
    /// Take permits under a leased permit id, or say when to look again.
    SEM_ACQUIRE => "semaphore/acquire.lua" with ["lib/permits.lua"];
    /// Return a permit id's permits and wake the waiters they may serve.
    SEM_RELEASE => "semaphore/release.lua" with ["lib/grant_message.lua", "lib/permits.lua"];
    /// The watchdog's renewal of one permit id's lease.
    SEM_RENEW => "semaphore/renew.lua" with ["lib/permits.lua"];
    /// A semaphore's total and available permits.
    SEM_STATE => "semaphore/state.lua" with ["lib/permits.lua"];
}

/// One script call with its KEYS and ARGV, encoded once so that a single
/// call (`invoke`, with the `NOSCRIPT` reload) and a pipelined one
/// (`evalsha`) cannot disagree on the order.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    script: &'static LazyLock<Script>,
    keys: Vec<String>,
    args: Vec<String>,
    /// Sent instead when the server refuses this call with `TRYAGAIN`
    /// (see [`Call::or_when_split`]).
    when_split: Option<Box<Call>>,
}

impl Call {
    pub(crate) fn new(script: &'static LazyLock<Script>) -> Self {
        Call {
            script,
            keys: Vec::new(),
            args: Vec::new(),
            when_split: None,
        }
    }

    /// `instead` is sent, on the same connection, when the server refuses
    /// this call with `TRYAGAIN`: its slot migrates, and the node has some
    /// of the keys it names but not all (a key that may well not exist,
    /// such as an empty list, beside ones that do). The script did not
    /// run; `instead` names fewer keys. Only [`invoke`](Call::invoke)
    /// sends it.
    pub(crate) fn or_when_split(mut self, instead: Call) -> Self {
        self.when_split = Some(Box::new(instead));
        self
    }

    pub(crate) fn key(mut self, key: &str) -> Self {
        self.keys.push(key.to_owned());
        self
    }

    pub(crate) fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Runs the script (`EVALSHA`, loading it once on `NOSCRIPT`).
    pub(crate) fn invoke<T: FromRedisValue>(&self, con: &mut dyn ConnectionLike) -> RedisResult<T> {
        let mut invocation = self.script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        for arg in &self.args {
            invocation.arg(arg);
        }
        match (invocation.invoke(con), &self.when_split) {
            (Err(err), Some(instead))
                if err.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) =>
            {
                instead.invoke(con)
            }
            (result, _) => result,
        }
    }

    /// Adds the call to a pipeline as a bare `EVALSHA` (the caller loads the
    /// script and handles `NOSCRIPT`).
    pub(crate) fn add_to(&self, pipe: &mut redis::Pipeline) {
        pipe.cmd("EVALSHA")
            .arg(self.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
    }

    /// The call as a bare `EVALSHA` command, to be sent without waiting
    /// for its reply (the caller handles `NOSCRIPT`, with `invoke`).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn packed(&self) -> Vec<u8> {
        redis::cmd("EVALSHA")
            .arg(self.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args)
            .get_packed_command()
    }

    /// Loads the script into the server's cache.
    pub(crate) fn load(&self, con: &mut dyn ConnectionLike) -> RedisResult<String> {
        self.script.load(con)
    }
}

/// Milliseconds of a duration already checked to be in range, as scripts
/// take them.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
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
        let (_, _, source) = all()
            .into_iter()
            .find(|(file, _, _)| *file == "lock/acquire.lua")
            .unwrap();
        let line = source
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
                "HSET in lock/acquire.lua (line {line} of the script as sent)"
            ))
        );
        assert_eq!(command_in_error("ERR something else"), None);
    }
}

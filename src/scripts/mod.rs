//! The server-side half of the protocol: one Lua script per operation, each
//! run atomically by Redis. The `.lua` files document their KEYS, ARGV and
//! replies; a [`Call`] sends one with `EVALSHA` and loads it when the
//! server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::fmt::{self, Display};
use std::io::Write as _;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{
    ConnectionLike, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, Value,
};

pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod reply;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

/// Declares every script once: its `static`, and its entry in the table
/// that traces errors back to a file and line. A script may list helpers
/// from `lib/` that are prepended to it (line numbers in Redis's errors
/// count them too), and parts that come before those helpers (`first`):
/// a script's usual path, which returns before the helpers it does not
/// need are defined. Every call of a script runs its whole chunk, and each
/// `local function` it reaches is a closure made anew, so a path that
/// returns early makes none of those below it.
macro_rules! scripts {
    ($(
        $(#[$doc:meta])*
        $name:ident => $file:literal $(first [$($first:literal),+])? $(with [$($lib:literal),+])?;
    )+) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
                Script::new(scripts!(@source [$($($first),+)?] [$($($lib),+)?] $file))
            });
        )+

        /// Every script with its file name and source as sent, for error
        /// messages.
        fn all() -> Vec<(&'static str, &'static LazyLock<Script>, &'static str)> {
            vec![$(($file, &$name, scripts!(@source [$($($first),+)?] [$($($lib),+)?] $file))),+]
        }
    };
    (@source [$($first:literal),*] [$($lib:literal),*] $file:literal) => {
        concat!($(include_str!($first),)* $(include_str!($lib),)* include_str!($file))
    };
}

scripts! {
    /// Take, re-enter, or report the holder's remaining lease.
    ACQUIRE => "lock/acquire.lua"
        first ["lib/next_fence.lua", "lock/usual/acquire.lua"]
        with ["lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua"];
    /// Take several locks of one slot at once, all or none (the multi-lock).
    ACQUIRE_MANY => "lock/acquire_many.lua"
        with ["lib/next_fence.lua", "lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua"];
    /// The last release of a holder, handing the lock to a local waiter.
    HANDOFF => "lock/handoff.lua" with ["lib/next_fence.lua"];
    /// Undo one level; the last level deletes the lock and pushes the baton.
    RELEASE => "lock/release.lua"
        first ["lock/usual/release.lua"]
        with ["lib/lease.lua", "lib/baton.lua", "lib/hand_over.lua", "lib/next_fence.lua", "lib/grant_message.lua", "lib/grant.lua"];
    /// A Redlock quorum's releases of a multi-lock's names on one master,
    /// each as `RELEASE` does it.
    RELEASE_MANY => "lock/release_many.lua"
        first ["lock/usual/release_many.lua"]
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
///
/// The words are kept as bytes in one buffer each and the command is
/// written out whole for the connection: every call of every operation
/// goes through here, and a word per allocation (three times over, as a
/// string, a script invocation's argument and a command's) cost the
/// client more than the rest of a fair lock's attempt.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    script: &'static LazyLock<Script>,
    keys: Words,
    args: Words,
    /// Sent instead when the server refuses this call with `TRYAGAIN`
    /// (see [`Call::or_when_split`]).
    when_split: Option<Box<Call>>,
}

impl Call {
    pub(crate) fn new(script: &'static LazyLock<Script>) -> Self {
        Call {
            script,
            // Room for most calls' words, so that they are written
            // without growing the buffers.
            keys: Words::with_capacity(4, 128),
            args: Words::with_capacity(16, 128),
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
        self.keys.push(key.as_bytes());
        self
    }

    pub(crate) fn arg(mut self, arg: impl Display) -> Self {
        self.args.push_display(arg);
        self
    }

    /// Runs the script (`EVALSHA`, loading it once on `NOSCRIPT`).
    pub(crate) fn invoke<T: FromRedisValue>(&self, con: &mut dyn ConnectionLike) -> RedisResult<T> {
        let packed = self.packed();
        let sent = match send(con, &packed) {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.load(con)?;
                send(con, &packed)
            }
            sent => sent,
        };
        match (sent, &self.when_split) {
            (Err(err), Some(instead))
                if err.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) =>
            {
                instead.invoke(con)
            }
            (sent, _) => Ok(redis::from_redis_value(sent?)?),
        }
    }

    /// Adds the call to a pipeline as a bare `EVALSHA` (the caller loads the
    /// script and handles `NOSCRIPT`).
    pub(crate) fn add_to(&self, pipe: &mut redis::Pipeline) {
        let evalsha = pipe
            .cmd("EVALSHA")
            .arg(self.script.get_hash())
            .arg(self.keys.len());
        for word in self.keys.iter().chain(self.args.iter()) {
            evalsha.arg(word);
        }
    }

    /// The call as a bare `EVALSHA` command, encoded for the connection:
    /// sent as it is by [`invoke`](Call::invoke), or without waiting for
    /// its reply (the caller handles `NOSCRIPT`, with `invoke`).
    pub(crate) fn packed(&self) -> Vec<u8> {
        let hash = self.script.get_hash().as_bytes();
        let words = 3 + self.keys.len() + self.args.len();
        // Each word's header is at most 24 bytes ("$" + 20 digits + CRLF),
        // and its CRLF after it 2.
        let size = 64 + hash.len() + self.keys.bytes.len() + self.args.bytes.len() + 26 * words;
        let mut out = Vec::with_capacity(size);
        out.push(b'*');
        push_decimal(&mut out, words);
        out.extend_from_slice(b"\r\n");
        push_bulk(&mut out, b"EVALSHA");
        push_bulk(&mut out, hash);
        let mut count = Vec::with_capacity(20);
        push_decimal(&mut count, self.keys.len());
        push_bulk(&mut out, &count);
        for word in self.keys.iter().chain(self.args.iter()) {
            push_bulk(&mut out, word);
        }
        out
    }

    /// Loads the script into the server's cache.
    pub(crate) fn load(&self, con: &mut dyn ConnectionLike) -> RedisResult<String> {
        self.script.load(con)
    }
}

/// Sends one packed command; an error reply is an error.
fn send(con: &mut dyn ConnectionLike, packed: &[u8]) -> RedisResult<Value> {
    con.req_packed_command(packed)?.extract_error()
}

/// A call's keys or its arguments: their bytes one after the other, and
/// where each ends.
#[derive(Clone)]
struct Words {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Words {
    fn with_capacity(words: usize, bytes: usize) -> Self {
        Words {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(words),
        }
    }

    fn push(&mut self, word: &[u8]) {
        self.bytes.extend_from_slice(word);
        self.ends.push(self.bytes.len());
    }

    fn push_display(&mut self, word: impl Display) {
        // Writing into a vector does not fail.
        let _ = write!(self.bytes, "{word}");
        self.ends.push(self.bytes.len());
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| &self.bytes[start..end])
    }
}

impl fmt::Debug for Words {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(String::from_utf8_lossy))
            .finish()
    }
}

/// Appends `word` as a RESP bulk string.
fn push_bulk(out: &mut Vec<u8>, word: &[u8]) {
    out.push(b'$');
    push_decimal(out, word.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(word);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal digits.
fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        // A digit: below 10.
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
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
    fn a_call_is_packed_as_redis_packs_the_same_evalsha() {
        let call = Call::new(&ACQUIRE)
            .key("redbaton:{a}:lock")
            .arg("client:7")
            .arg(30_000u64)
            .key("")
            .arg("")
            .arg(-1i64)
            .arg("ünïcode ✓");
        let expected = redis::cmd("EVALSHA")
            .arg(ACQUIRE.get_hash())
            .arg(2)
            .arg("redbaton:{a}:lock")
            .arg("")
            .arg("client:7")
            .arg("30000")
            .arg("")
            .arg("-1")
            .arg("ünïcode ✓")
            .get_packed_command();
        assert_eq!(
            String::from_utf8_lossy(&call.packed()),
            String::from_utf8_lossy(&expected)
        );
        let mut pipe = redis::pipe();
        call.add_to(&mut pipe);
        assert_eq!(pipe.get_packed_pipeline(), expected);
        let many = (0..12).fold(Call::new(&ACQUIRE), |call, n| call.arg(n));
        let expected = (0..12)
            .fold(
                redis::cmd("EVALSHA").arg(ACQUIRE.get_hash()).arg(0).clone(),
                |mut cmd, n| {
                    cmd.arg(n);
                    cmd
                },
            )
            .get_packed_command();
        assert_eq!(many.packed(), expected);
    }

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

//! A client used in a forked child (issue 9): the child inherits the
//! client, its connections, the thread's identity and the table of held
//! locks, and must not use them: every call is refused with
//! `Error::ForkedProcess`, and the parent's lock is untouched.

mod support;

use std::time::{Duration, Instant};

use redbaton::Error;
use testkit::RedisServer;

#[test]
fn a_forked_child_cannot_use_its_parents_client_or_locks() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.lock("forked").unwrap();
    let guard = lock.lock().unwrap();
    let owner = lock.holder().unwrap().unwrap().owner;

    // SAFETY: the child only calls into redbaton (which refuses before any
    // network call or lock of the client) and then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let refused =
            |result: Result<(), Error>| matches!(result, Err(Error::ForkedProcess { .. }));
        let checks = [
            refused(lock.try_lock().map(drop)),
            refused(lock.is_locked().map(drop)),
            refused(client.lock("other").unwrap().try_lock().map(drop)),
            refused(guard.unlock()),
        ];
        let code = if checks.iter().all(|ok| *ok) { 0 } else { 1 };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(done >= 0, "waitpid failed");
        if done == pid {
            break;
        }
        assert!(Instant::now() < deadline, "the forked child hangs");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(libc::WIFEXITED(status), "the child did not exit: {status}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "a call in the child was not refused"
    );
    // The parent's lock is untouched, and its own calls work.
    assert_eq!(lock.holder().unwrap().unwrap().owner, owner);
    assert!(lock.try_lock().unwrap().is_some(), "re-entry in the parent");
}

//! Users of a test server with rights taken away.

/// Adds the user `no-tracking` on the server `admin` is connected to
/// (which `url`, a `redis://` URL without a user, names): every right but
/// `CLIENT TRACKING`, and no password. Returns that user's URL. A redbaton
/// client of this user turns its parking hub off and parks each waiter in
/// `BLPOP`.
pub fn untracked_user(admin: &mut redis::Connection, url: &str) -> String {
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "no-tracking",
            "on",
            "nopass",
            "~*",
            "&*",
            "+@all",
        ])
        .arg("-client|tracking")
        .query::<()>(admin)
        .expect("ACL SETUSER no-tracking");
    url.replacen("redis://", "redis://no-tracking:x@", 1)
}

/// Adds the user `no-grants` on the server `admin` is connected to (which
/// `url`, a `redis://` URL without a user, names): every right, but of the
/// pub/sub channels only the server's announcements of changed keys.
/// Returns that user's URL. A redbaton client of this user parks its
/// waiters on its hub, but is refused its grant channel: a release wakes
/// its waiters to take the lock themselves instead of granting it.
pub fn ungranted_user(admin: &mut redis::Connection, url: &str) -> String {
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "no-grants",
            "on",
            "nopass",
            "~*",
            "resetchannels",
            "&__redis__:invalidate",
            "+@all",
        ])
        .query::<()>(admin)
        .expect("ACL SETUSER no-grants");
    url.replacen("redis://", "redis://no-grants:x@", 1)
}

use std::sync::LazyLock;

use redbaton::Client;

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[redbaton::locked(client = LOCKS, key = "a", fair, rw = read)]
fn two_kinds() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, key = "b", rw = maybe, semaphore = 0)]
fn bad_values() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, key = "c", semaphore, lease = "5s", fencing = token)]
fn not_for_permits() -> Result<(), redbaton::Error> {
    Ok(())
}

fn main() {}

//! `fair`, `rw = read | write` and `semaphore`, with the options each takes.

use std::sync::LazyLock;

use redbaton::Client;

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[redbaton::locked(client = LOCKS, key = "turn:{who}", fair, wait = "5s", lease = "30s", fencing = token)]
fn in_turn(who: u32) -> Result<u64, redbaton::Error> {
    let _ = who;
    Ok(token)
}

#[redbaton::locked(client = LOCKS, key = "doc:{id}", rw = read, wait = "1s")]
fn read_doc(id: u64) -> Result<(), redbaton::Error> {
    let _ = id;
    Ok(())
}

#[redbaton::locked(client = LOCKS, key = "doc:{id}", rw = write, fixed_lease = "10s", fencing = token)]
fn write_doc(id: u64) -> Result<u64, redbaton::Error> {
    let _ = id;
    Ok(token)
}

#[redbaton::locked(client = LOCKS, key = "partner-api", semaphore)]
fn call_partner() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, key = "gpu", semaphore = 2, wait = "30s", fixed_lease = "1h")]
fn train() -> Result<(), redbaton::Error> {
    Ok(())
}

fn main() {
    let _ = (in_turn, read_doc, write_doc, call_partner, train);
}

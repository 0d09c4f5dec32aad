use std::sync::LazyLock;

use redbaton::Client;

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[redbaton::locked(client = LOCKS, keys = ["a", "b"], fair)]
fn fair() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = ["a", "b"], rw = write)]
fn rw() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = ["a", "b"], semaphore = 2, wait = "1s")]
fn semaphore() -> Result<(), redbaton::Error> {
    Ok(())
}

fn main() {}

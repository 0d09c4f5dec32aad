use std::sync::LazyLock;

use redbaton::Client;

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[redbaton::locked(client = LOCKS, key = "a", keys = ["b"])]
fn both(from: u64) -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = [])]
fn none() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = "account:{from}")]
fn not_a_list(from: u64) -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = ["account:{from}", "account:{too}", "{}"])]
fn unknown_capture(from: u64, to: u64) -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = ["a:{from}", "b"], fencing = from)]
fn fencing_hides_an_argument(from: u64) -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, keys = ["a", { 7 }])]
fn wrong_key_type() -> Result<(), redbaton::Error> {
    Ok(())
}

fn main() {}

//! `keys = [ … ]`: a multi-lock over templates and blocks, with every
//! option a multi-lock takes, on free functions and methods.

use std::sync::LazyLock;

use redbaton::{Client, Error};

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[redbaton::locked(client = LOCKS, keys = ["account:{from}", "account:{to}"])]
fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, Error> {
    Ok(amount)
}

#[redbaton::locked(client = LOCKS, keys = ["one:{id:04}"], wait = "5s", lease = "30s")]
fn one_name(id: u32) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, keys = ["a:{x}", { format!("b:{}", x + 1) }, name, "fixed"], fixed_lease = "1m", fencing = tokens)]
fn mixed(c: &Client, x: u64, name: &str) -> Result<u64, Error> {
    let tokens: [u64; 4] = tokens; // one token per name, in the order of `keys`
    Ok(tokens.iter().sum())
}

struct Ledger {
    locks: Client,
    region: String,
}

impl Ledger {
    #[redbaton::locked(client = self.locks, keys = [{ format!("{}:{}", self.region, a) }, "{b}"], crate = ::redbaton)]
    fn post(&self, a: u64, b: u64) -> Result<(), Error> {
        Ok(())
    }
}

fn main() {
    let _ = (transfer, one_name, mixed, Ledger::post);
}

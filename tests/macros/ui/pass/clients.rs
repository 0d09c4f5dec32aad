//! `client` is any expression that gives a `Client` by reference: a static
//! behind `LazyLock`, a reference, an `Arc`, a call that returns a client or
//! a reference to one, a field.

use std::sync::{Arc, LazyLock, OnceLock};

use redbaton::{Client, Error};

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

fn fresh_client() -> Client {
    Client::open("redis://127.0.0.1/").expect("a valid URL")
}

fn shared_client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(fresh_client)
}

#[redbaton::locked(client = LOCKS, key = "static")]
fn from_static() -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = client, key = "reference:{id}")]
fn from_reference(client: &Client, id: u32) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = client, key = "arc")]
fn from_arc(client: Arc<Client>) -> Result<Arc<Client>, Error> {
    Ok(client) // still usable: the macro only borrowed it
}

#[redbaton::locked(client = fresh_client(), key = "temporary")]
fn from_temporary() -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = shared_client(), key = "call")]
fn from_call() -> Result<(), Error> {
    Ok(())
}

struct Service {
    locks: Client,
}

impl Service {
    #[redbaton::locked(client = self.locks, key = "field")]
    fn from_field(&self) -> Result<(), Error> {
        Ok(())
    }
}

fn main() {
    let _ = (from_static, from_reference, from_arc, from_temporary, from_call);
    let _ = Service::from_field;
}

//! `wait`, `lease`, `fixed_lease` and `fencing`, alone and together.

use std::sync::LazyLock;

use redbaton::Client;

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[redbaton::locked(client = LOCKS, key = "report:{day}", wait = "5s", lease = "30s", fencing = token)]
fn build_report(day: &str) -> Result<u64, redbaton::Error> {
    let token: u64 = token; // a u64, usable by the body
    Ok(token)
}

#[redbaton::locked(client = LOCKS, key = "a", wait = "250ms")]
fn waits(_: ()) -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, key = "b", lease = "2m")]
fn renewed() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = LOCKS, key = "c", fixed_lease = "1h", wait = "1_500ms")]
fn fixed() -> Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(fencing = fence, key = "d", client = LOCKS)]
fn any_order() -> Result<u64, redbaton::Error> {
    Ok(fence)
}

fn main() {
    let _ = (build_report, waits, renewed, fixed, any_order);
}

//! `crate = path` for a renamed or re-exported redbaton.

extern crate redbaton as locks;

mod infra {
    pub use ::redbaton;
}

#[locks::locked(client = c, key = "renamed", crate = ::locks)]
fn renamed(c: &locks::Client) -> Result<(), locks::Error> {
    Ok(())
}

#[infra::redbaton::locked(client = c, key = "re-exported", crate = infra::redbaton, wait = "1s")]
fn re_exported(c: &infra::redbaton::Client) -> Result<(), infra::redbaton::Error> {
    Ok(())
}

fn main() {
    let _ = (renamed, re_exported);
}

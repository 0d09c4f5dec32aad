use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k", fairness = true)]
fn fair(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k", timeout = "5s")]
fn timeout(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

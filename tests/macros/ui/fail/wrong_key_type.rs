use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = { 42 })]
fn pay(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

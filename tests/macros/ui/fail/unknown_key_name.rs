use redbaton::{Client, Error};

const TENANT: &str = "acme";

#[redbaton::locked(client = c, key = "order:{orderid}")]
fn pay(c: &Client, order_id: u64, amount: u64) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "{TENANT}:report")]
fn constant(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

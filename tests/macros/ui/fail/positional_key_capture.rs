use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "order:{}:{0}")]
fn pay(c: &Client, order_id: u64) -> Result<(), Error> {
    Ok(())
}

fn main() {}

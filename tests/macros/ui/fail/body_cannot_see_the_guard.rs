use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k")]
fn pay(c: &Client) -> Result<(), Error> {
    drop(__redbaton_guard);
    Ok(())
}

fn main() {}

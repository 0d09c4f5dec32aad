use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k", lease = "30s", fixed_lease = "30s")]
fn both(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

use redbaton::{Client, Error};

#[redbaton::locked(client = c, client = c, key = "k")]
fn twice(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key)]
fn without_value(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c; key = "k")]
fn not_a_list(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

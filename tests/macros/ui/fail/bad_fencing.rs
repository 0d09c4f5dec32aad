use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k", fencing = self.token)]
fn not_a_name(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k:{amount}", fencing = amount)]
fn hides_an_argument(c: &Client, amount: u64) -> Result<(), Error> {
    Ok(())
}

fn main() {}

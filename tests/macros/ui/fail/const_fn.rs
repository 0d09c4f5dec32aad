use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k")]
const fn at_compile_time(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

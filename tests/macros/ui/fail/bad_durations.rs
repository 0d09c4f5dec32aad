use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k", wait = "5 seconds")]
fn spelled_out(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k", wait = "5")]
fn no_unit(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k", lease = 30)]
fn unquoted(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k", wait = "0s")]
fn zero_wait(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k", fixed_lease = "0ms")]
fn zero_lease(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "k", lease = "9000h")]
fn over_a_year(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

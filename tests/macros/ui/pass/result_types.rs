//! Error types: anything with `From<redbaton::Error>`, written as a path
//! ending in `Result`; generic ones too.

use redbaton::Client;

type AppResult<T> = Result<T, redbaton::Error>;

#[redbaton::locked(client = c, key = "alias")]
fn alias(c: &Client) -> AppResult<u8> {
    Ok(1)
}

#[redbaton::locked(client = c, key = "boxed")]
fn boxed(c: &Client) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    Ok(())
}

#[redbaton::locked(client = c, key = "qualified")]
fn qualified(c: &Client) -> std::result::Result<(), redbaton::Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "generic")]
fn generic<E: From<redbaton::Error>>(c: &Client) -> Result<(), E> {
    Ok(())
}

fn main() {
    let _ = (alias, boxed, qualified);
    let _ = generic::<redbaton::Error>;
}

use redbaton::Error;

#[redbaton::locked]
fn nothing() -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(key = "k")]
fn no_client() -> Result<(), Error> {
    Ok(())
}

fn main() {}

use redbaton::Error;

#[redbaton::locked(client = url, key = "k")]
fn pay(url: &str) -> Result<(), Error> {
    Ok(())
}

fn main() {}

use redbaton::{Client, Error};

#[redbaton::locked(client = c, key = "k")]
async fn sync_only(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {}

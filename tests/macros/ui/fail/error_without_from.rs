use redbaton::Client;

#[derive(Debug)]
struct AppError;

#[redbaton::locked(client = c, key = "k")]
fn pay(c: &Client) -> Result<(), AppError> {
    Ok(())
}

fn main() {}

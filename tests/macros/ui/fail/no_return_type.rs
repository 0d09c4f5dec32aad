use redbaton::Client;

#[redbaton::locked(client = c, key = "k")]
fn returns_nothing(c: &Client) {}

fn main() {}

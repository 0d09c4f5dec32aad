use redbaton::Client;

#[redbaton::locked(client = c, key = "k")]
fn returns_an_option(c: &Client) -> Option<u8> {
    Some(1)
}

fn main() {}

#[redbaton::locked(client = C, key = "k")]
struct Order;

fn main() {}

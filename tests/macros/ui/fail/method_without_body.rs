use redbaton::{Client, Error};

trait Payments {
    #[redbaton::locked(client = self.locks(), key = "k")]
    fn pay(&self) -> Result<(), Error>;

    fn locks(&self) -> &Client;
}

fn main() {}

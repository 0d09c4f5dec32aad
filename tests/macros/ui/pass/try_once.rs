//! The default: one attempt; the key is a template of the arguments; `?`
//! and `return` in the body keep their meaning.

use std::sync::LazyLock;

use redbaton::Client;

static LOCKS: LazyLock<Client> =
    LazyLock::new(|| Client::open("redis://127.0.0.1/").expect("a valid URL"));

#[derive(Debug)]
enum AppError {
    Lock(redbaton::Error),
    Declined,
}

impl From<redbaton::Error> for AppError {
    fn from(error: redbaton::Error) -> Self {
        AppError::Lock(error)
    }
}

struct Receipt {
    amount: u64,
}

fn charge(amount: u64) -> Result<u64, AppError> {
    if amount == 0 {
        Err(AppError::Declined)
    } else {
        Ok(amount)
    }
}

#[redbaton::locked(client = LOCKS, key = "order:{order_id}:{amount:>8}")]
fn pay(order_id: u64, amount: u64) -> Result<Receipt, AppError> {
    if order_id == 0 {
        return Err(AppError::Declined);
    }
    let amount = charge(amount)?;
    Ok(Receipt { amount })
}

fn main() {
    let _: fn(u64, u64) -> Result<Receipt, AppError> = pay;
    let _ = |r: Receipt| r.amount;
    let _ = AppError::Lock;
}

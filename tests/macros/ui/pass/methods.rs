//! Methods: every receiver, trait impls, generics; keys from `self`
//! through a block.

use redbaton::{Client, Error};

struct Account {
    locks: Client,
    id: u64,
    balance: u64,
}

impl Account {
    #[redbaton::locked(client = self.locks, key = { format!("account:{}", self.id) })]
    fn balance(&self) -> Result<u64, Error> {
        Ok(self.balance)
    }

    #[redbaton::locked(client = self.locks, key = { format!("account:{}", self.id) })]
    fn deposit(&mut self, amount: u64) -> Result<u64, Error> {
        self.balance += amount;
        Ok(self.balance)
    }

    /// `self` by value: the macro's borrow of it ends before the body moves it.
    #[redbaton::locked(client = self.locks, key = { format!("account:{}", self.id) })]
    fn close(self) -> Result<Client, Error> {
        Ok(self.locks)
    }

    #[redbaton::locked(client = self.locks, key = "transfer:{to}")]
    fn transfer<T: Into<u64>>(&mut self, to: u64, amount: T) -> Result<(), Error> {
        self.balance -= amount.into();
        Ok(())
    }
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "account:{}", self.id)
    }
}

impl Account {
    /// `self` is an argument too: a template may capture it.
    #[redbaton::locked(client = self.locks, key = "{self}")]
    fn displayed(&self) -> Result<(), Error> {
        Ok(())
    }
}

trait Audited {
    fn audit(&self, year: u16) -> Result<(), Error>;
}

impl Audited for Account {
    #[redbaton::locked(client = self.locks, key = "audit:{year}")]
    fn audit(&self, year: u16) -> Result<(), Error> {
        Ok(())
    }
}

fn main() {
    let _ = (Account::balance, Account::deposit, Account::close, Account::displayed);
    let _ = Account::transfer::<u32>;
    let _ = <Account as Audited>::audit;
}

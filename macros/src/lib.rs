//! The `#[redbaton::locked(...)]` attribute: a function that holds a
//! redbaton lock, named from its arguments, for its whole body.
//!
//! Use it through `redbaton` with its `macros` feature (`redbaton::locked`),
//! whose documentation describes every option. This crate only parses and
//! checks at compile time; the code it writes calls `redbaton::__private`,
//! so what happens at run time lives, and is tested, in `redbaton`.
//!
//! The steps, one module each:
//!
//! - `options`: the attribute's `name = value` list, checked;
//! - `duration`: `"250ms"`, `"5s"`, `"2m"`, `"1h"` read at compile time;
//! - `signature`: what the function must look like, and the names its
//!   arguments bind;
//! - `key`: the key template's `{…}` captures (of `key`, and of each of
//!   `keys`), checked against those names;
//! - `expand`: the function again, with the guard taken before its body;
//! - `errors`: every mistake reported at once.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms)]

mod duration;
mod errors;
mod expand;
mod key;
mod options;
mod signature;

use proc_macro::TokenStream;

/// Defined in the `redbaton-macros` crate: use it as `redbaton::locked`,
/// with redbaton's `macros` feature, whose documentation lists the options
/// and the rules.
#[proc_macro_attribute]
pub fn locked(options: TokenStream, function: TokenStream) -> TokenStream {
    expand::locked(options.into(), function.into()).into()
}

//! The function again, with its lock taken before its body:
//!
//! ```text
//! fn pay(order_id: u64, amount: u64) -> Result<Receipt, AppError> {
//!     let guard = {
//!         let client: &::redbaton::Client = &(LOCKS);
//!         let name = ::std::format!("order:{order_id}");
//!         match ::redbaton::__private::lock(client, name.lock_name(), options) {
//!             Ok(guard) => guard,
//!             Err(error) => return ::redbaton::__private::fail(error),
//!         }
//!     };
//!     let token: u64 = guard.fencing_token();   // with `fencing = token`
//!     /* the body's statements, unchanged */
//! }
//! ```
//!
//! No closure: `return` and `?` in the body keep their meaning, and the
//! guard, the first local, is dropped last, after the value is computed,
//! on return and on panic alike. The macro's own locals have mixed-site
//! hygiene, so the body can neither see nor shadow them; the caller's
//! tokens (the client expression, the key) keep their spans, so a type
//! error points at what the caller wrote.

use std::time::Duration;

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, Item, ItemFn, Stmt};

use crate::errors::Errors;
use crate::key;
use crate::options::{Key, Kind, Lease, Names, Options};
use crate::signature::{self, Checked};

/// The attribute's expansion: the locked function, or the errors followed
/// by the function as written (so that its callers do not fail too).
pub(crate) fn locked(options: TokenStream, function: TokenStream) -> TokenStream {
    match expand(options, function.clone()) {
        Ok(tokens) => tokens,
        Err(error) => {
            // The function as written, so that its callers compile; its
            // arguments may now look unused (the attribute was to use
            // them), which is no news next to the error.
            let error = error.into_compile_error();
            quote!(#error #[allow(unused_variables)] #function)
        }
    }
}

fn expand(options: TokenStream, function: TokenStream) -> syn::Result<TokenStream> {
    let mut function = parse_function(function)?;
    let mut errors = Errors::default();
    let options = Options::parse(options).map_err(|e| errors.push(e)).ok();
    let checked = signature::check(&function.sig)
        .map_err(|e| errors.push(e))
        .ok();
    if let (Some(options), Some(checked)) = (&options, &checked) {
        let keys = match &options.names {
            Names::One(key) => std::slice::from_ref(key),
            Names::Many(keys) => keys.as_slice(),
        };
        for key in keys {
            if let Key::Template(template) = key {
                if let Err(error) =
                    key::check_template(template, &function.sig.ident, &checked.arguments)
                {
                    errors.push(error);
                }
            }
        }
        if let Some(fencing) = &options.fencing {
            if checked.arguments.iter().any(|a| a == fencing) {
                errors.push(syn::Error::new(
                    fencing.span(),
                    format!(
                        "`fencing = {fencing}` would hide the argument `{fencing}`; \
                         name the token otherwise"
                    ),
                ));
            }
        }
    }
    errors.finish()?;
    let (Some(options), Some(checked)) = (options, checked) else {
        return Err(syn::Error::new(Span::call_site(), "invalid attribute"));
    };
    let prologue = prologue(&options, &checked);
    let body = std::mem::take(&mut function.block.stmts);
    function.block.stmts = prologue;
    function.block.stmts.extend(body);
    Ok(function.into_token_stream())
}

/// The function the attribute is on, or an error that says where the
/// attribute goes.
fn parse_function(function: TokenStream) -> syn::Result<ItemFn> {
    match syn::parse2::<Item>(function)? {
        Item::Fn(function) => Ok(function),
        other => Err(syn::Error::new_spanned(
            other,
            "`#[redbaton::locked]` goes on a function with a body: a free function, or a \
             method in an `impl` block",
        )),
    }
}

/// The statements that take the lock, before the body's.
fn prologue(options: &Options, checked: &Checked) -> Vec<Stmt> {
    let krate = &options.krate;
    // The macro's locals: invisible to the body (mixed-site hygiene).
    let local = |name: &str| Ident::new(name, Span::mixed_site());
    let (guard, client, name, error) = (
        local("__redbaton_guard"),
        local("__redbaton_client"),
        local("__redbaton_name"),
        local("__redbaton_error"),
    );

    // `&(EXPR)` coerces a `Client`, a `LazyLock<Client>`, an `Arc<Client>`
    // (through `Deref`) and a temporary from a call (kept alive to the end
    // of the block) to `&Client`; a mismatch points at the expression.
    let client_expr = &options.client;
    let client_ref = quote_spanned!(client_expr.span()=> &(#client_expr));

    // The names' values, and how to read each as a `&str`: one name, or a
    // tuple of them for `keys` (a tuple, since each may be of its own type).
    let (name_value, lock_name) = match &options.names {
        Names::One(key) => {
            let (value, span) = name_value(key);
            let lock_name = relocated(quote!(#krate::__private::LockName::lock_name(&#name)), span);
            (value, lock_name)
        }
        Names::Many(keys) => {
            let (values, lock_names): (Vec<_>, Vec<_>) = keys
                .iter()
                .enumerate()
                .map(|(index, key)| {
                    let (value, span) = name_value(key);
                    let index = syn::Index::from(index);
                    let lock_name = relocated(
                        quote!(#krate::__private::LockName::lock_name(&#name.#index)),
                        span,
                    );
                    (value, lock_name)
                })
                .unzip();
            (quote!((#(#values,)*)), quote!([#(#lock_names),*]))
        }
    };

    let wait = match options.wait {
        Some(wait) => {
            let wait = duration(wait);
            quote!(::core::option::Option::Some(#wait))
        }
        None => quote!(::core::option::Option::None),
    };
    let lease = match options.lease {
        Lease::ClientDefault => quote!(#krate::__private::Lease::ClientDefault),
        Lease::Renewed(lease) => {
            let lease = duration(lease);
            quote!(#krate::__private::Lease::Renewed(#lease))
        }
        Lease::Fixed(lease) => {
            let lease = duration(lease);
            quote!(#krate::__private::Lease::Fixed(#lease))
        }
    };

    let kind = match options.kind {
        Kind::Lock => quote!(#krate::__private::Kind::Lock),
        Kind::Fair => quote!(#krate::__private::Kind::Fair),
        Kind::Read => quote!(#krate::__private::Kind::Read),
        Kind::Write => quote!(#krate::__private::Kind::Write),
        Kind::Semaphore(permits) => quote!(#krate::__private::Kind::Semaphore(#permits)),
    };

    // Located at the return type, so that an error type without
    // `From<redbaton::Error>` is reported there.
    let fail = relocated(quote!(#krate::__private::fail(#error)), checked.output);

    let lock = match options.names {
        Names::One(_) => quote!(#krate::__private::lock),
        Names::Many(_) => quote!(#krate::__private::lock_many),
    };
    let take = quote! {
        let #guard = {
            let #client: &#krate::Client = #client_ref;
            let #name = #name_value;
            match #lock(
                #client,
                #lock_name,
                #krate::__private::LockOptions { wait: #wait, lease: #lease, kind: #kind },
            ) {
                ::core::result::Result::Ok(#guard) => #guard,
                ::core::result::Result::Err(#error) => return #fail,
            }
        };
    };
    let fencing = options.fencing.as_ref().map(|token| match &options.names {
        Names::One(_) => quote! {
            let #token: u64 = #guard.fencing_token();
        },
        // One token per name, in the order of `keys`.
        Names::Many(keys) => {
            let count = keys.len();
            quote! {
                let #token: [u64; #count] = #guard.fencing_tokens();
            }
        }
    });
    // Statements by construction: `parse_quote!` cannot fail on them.
    syn::parse_quote!(#take #fencing)
}

/// A name's value (a `format!` of a template, or the expression) and
/// where errors about it point.
fn name_value(key: &Key) -> (TokenStream, Span) {
    match key {
        // The literal keeps the caller's span, so its captures resolve
        // among the function's arguments.
        Key::Template(template) => (quote!(::std::format!(#template)), template.span()),
        // Located at the key, so that a block of the wrong type is
        // reported there.
        Key::Expr(expr) => (expr.to_token_stream(), expr.span()),
    }
}

/// `tokens`, shown at `location` in error messages: every token (the
/// caller's too) keeps the names it resolves to, and only where the
/// compiler points changes. A path the macro writes would otherwise point
/// at the whole attribute.
fn relocated(tokens: TokenStream, location: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), relocated(group.stream(), location));
                inner.set_span(group.span().located_at(location));
                token = TokenTree::Group(inner);
            } else {
                token.set_span(token.span().located_at(location));
            }
            token
        })
        .collect()
}

/// `duration` as an expression (every duration the grammar allows is
/// whole milliseconds).
fn duration(duration: Duration) -> TokenStream {
    let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_millis(#millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_to_string(options: TokenStream, function: TokenStream) -> String {
        locked(options, function).to_string()
    }

    #[test]
    fn the_guard_is_taken_before_the_body_which_is_kept_as_written() {
        let out = expand_to_string(
            quote!(
                client = LOCKS,
                key = "order:{id}",
                wait = "5s",
                fencing = token
            ),
            quote!(
                pub fn pay(id: u64) -> Result<u64, AppError> {
                    let x = id + 1;
                    Ok(x + token)
                }
            ),
        );
        let guard = out.find("__redbaton_guard").unwrap();
        let body = out.find("let x = id + 1").unwrap();
        assert!(guard < body, "{out}");
        assert!(out.contains(":: redbaton :: __private :: lock"), "{out}");
        assert!(
            out.contains(":: core :: time :: Duration :: from_millis (5000u64)"),
            "{out}"
        );
        assert!(
            out.contains("let token : u64 = __redbaton_guard . fencing_token ()"),
            "{out}"
        );
        assert!(out.ends_with("Ok (x + token) }"), "{out}");
    }

    #[test]
    fn keys_take_the_multi_lock_over_a_tuple_of_names_with_a_token_each() {
        let out = expand_to_string(
            quote!(client = C, keys = ["a:{x}", { name() }], fencing = tokens),
            quote!(
                fn f(x: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains(":: redbaton :: __private :: lock_many"),
            "{out}"
        );
        assert!(
            out.contains("(:: std :: format ! (\"a:{x}\") , { name () } ,)"),
            "{out}"
        );
        assert!(out.contains("__redbaton_name . 0") && out.contains("__redbaton_name . 1"));
        assert!(
            out.contains("let tokens : [u64 ; 2usize] = __redbaton_guard . fencing_tokens ()"),
            "{out}"
        );
    }

    #[test]
    fn a_renamed_crate_is_used_for_every_path() {
        let out = expand_to_string(
            quote!(client = C, key = "k", crate = ::infra::locks, lease = "1s"),
            quote!(
                fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(!out.contains(":: redbaton"), "{out}");
        assert!(
            out.contains(":: infra :: locks :: __private :: Lease :: Renewed"),
            "{out}"
        );
    }

    #[test]
    fn on_errors_the_function_is_kept_after_them() {
        let out = expand_to_string(
            quote!(key = "k"),
            quote!(
                fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.starts_with(":: core :: compile_error !"), "{out}");
        assert!(
            out.ends_with("fn f () -> Result < () , E > { Ok (()) }"),
            "{out}"
        );
    }
}

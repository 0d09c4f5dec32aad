//! What a locked function must look like, and what its arguments bind.
//!
//! The attribute adds an early `return` of redbaton's errors before the
//! body, so the function must return a `Result` whose error type converts
//! from `redbaton::Error`. The error type itself is checked by the compiler
//! (through `redbaton::__private::FromLockError`, whose message says what
//! to add); here only the shape is checked, because a shape error is
//! clearer said at the signature than found in generated code.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, Pat, ReturnType, Signature, Type};

use crate::errors::Errors;

/// What the rest of the expansion needs from a checked signature.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The names the arguments bind (`self` for a receiver), in order.
    pub(crate) arguments: Vec<Ident>,
    /// Where the return type is written: errors about the error type
    /// point there.
    pub(crate) output: Span,
}

/// Checks `signature`, reporting every problem at once.
pub(crate) fn check(signature: &Signature) -> syn::Result<Checked> {
    let mut errors = Errors::default();
    let name = &signature.ident;
    if let Some(asyncness) = &signature.asyncness {
        errors.push(syn::Error::new(
            asyncness.span(),
            format!(
                "`#[redbaton::locked]` cannot go on an `async fn`: redbaton blocks the thread \
                 while it waits and releases, and its guard cannot cross an `.await`; make \
                 `{name}` a plain `fn` (run it with `spawn_blocking` from async code)"
            ),
        ));
    }
    if let Some(constness) = &signature.constness {
        errors.push(syn::Error::new(
            constness.span(),
            format!(
                "`#[redbaton::locked]` cannot go on a `const fn`: taking a lock talks to Redis \
                 at run time; remove `const` from `{name}`"
            ),
        ));
    }
    let output = match &signature.output {
        ReturnType::Type(_, ty) if returns_result(ty) => ty.span(),
        ReturnType::Type(_, ty) => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "a `#[redbaton::locked]` function returns `Result<T, E>` with \
                     `E: From<redbaton::Error>`, to report a busy lock or a Redis failure; \
                     make `{name}` return a `Result` (its type must be written as a path \
                     ending in `Result`, such as `Result<T, E>` or `io::Result<T>`)"
                ),
            ));
            ty.span()
        }
        ReturnType::Default => {
            errors.push(syn::Error::new(
                name.span(),
                format!(
                    "`{name}` returns nothing, but a `#[redbaton::locked]` function returns \
                     `Result<T, E>` with `E: From<redbaton::Error>`, to report a busy lock or a \
                     Redis failure; add `-> Result<(), YourError>`"
                ),
            ));
            name.span()
        }
    };
    let mut arguments = Vec::new();
    for input in &signature.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                arguments.push(Ident::new("self", receiver.self_token.span()));
            }
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut arguments),
        }
    }
    errors.finish()?;
    Ok(Checked { arguments, output })
}

/// Whether `ty` is written as a `Result`: a path whose last name ends in
/// `Result` (`Result<T, E>`, `std::io::Result<T>`, `AppResult<T>`). An
/// alias named otherwise is refused: the check is on the spelling, and the
/// compiler checks the error type.
fn returns_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident.to_string().ends_with("Result")),
        Type::Paren(inner) => returns_result(&inner.elem),
        Type::Group(inner) => returns_result(&inner.elem),
        _ => false,
    }
}

/// Adds the names `pattern` binds to `names`: `order_id` of
/// `order_id: u64`, `a` and `b` of `(a, b): (u32, u32)`.
fn bound_names(pattern: &Pat, names: &mut Vec<Ident>) {
    match pattern {
        Pat::Ident(ident) => {
            names.push(ident.ident.clone());
            if let Some((_, sub)) = &ident.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(fields) => fields
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        // Or-patterns bind the same names in every branch.
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                bound_names(first, names);
            }
        }
        // Wildcards, literals, ranges, paths, `..` and macros bind nothing
        // a template could name.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(tokens: proc_macro2::TokenStream) -> Signature {
        syn::parse2::<syn::ItemFn>(tokens).unwrap().sig
    }

    fn names(checked: &Checked) -> Vec<String> {
        checked.arguments.iter().map(|i| i.to_string()).collect()
    }

    #[test]
    fn the_names_of_every_pattern_are_collected() {
        let checked = check(&signature(quote::quote! {
            fn f(&self, a: u8, mut b: u8, (c, d): (u8, u8), P { x, y: renamed }: P,
                 [first, ..]: [u8; 3], _: u8, e @ 1..=3: u8) -> Result<(), E> {}
        }))
        .unwrap();
        assert_eq!(
            names(&checked),
            ["self", "a", "b", "c", "d", "x", "renamed", "first", "e"]
        );
    }

    #[test]
    fn results_are_recognized_by_their_last_name() {
        for ok in [
            quote::quote!(
                fn f() -> Result<(), E> {}
            ),
            quote::quote!(
                fn f() -> std::io::Result<()> {}
            ),
            quote::quote!(
                fn f() -> AppResult<u8> {}
            ),
        ] {
            assert!(check(&signature(ok)).is_ok());
        }
        for (bad, expected) in [
            (
                quote::quote!(
                    fn f() {}
                ),
                "`f` returns nothing",
            ),
            (
                quote::quote!(
                    fn f() -> Option<u8> {}
                ),
                "make `f` return a `Result`",
            ),
            (
                quote::quote!(
                    fn f() -> Box<Result<u8, E>> {}
                ),
                "make `f` return a `Result`",
            ),
            (
                quote::quote!(
                    async fn f() -> Result<u8, E> {}
                ),
                "cannot go on an `async fn`",
            ),
            (
                quote::quote!(
                    const fn f() -> Result<u8, E> {}
                ),
                "cannot go on a `const fn`",
            ),
        ] {
            let error = check(&signature(bad)).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn an_async_fn_without_a_result_gets_both_errors() {
        let error = check(&signature(quote::quote!(
            async fn f() {}
        )))
        .unwrap_err();
        assert_eq!(error.into_iter().count(), 2);
    }
}

//! Errors gathered so that a caller sees every mistake of an attribute at
//! once, each at its own tokens, instead of fixing them one build at a time.

use proc_macro2::Span;

/// Errors gathered so that all are reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds `error` to those to report.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// `Err` with every error pushed, if any.
    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }

    /// Every error pushed, for a caller that has pushed at least one.
    pub(crate) fn into_error(self) -> syn::Error {
        self.0
            .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid attribute"))
    }
}

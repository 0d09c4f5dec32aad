//! The key template: `key = "order:{order_id}"` is a `format!` string whose
//! `{…}` capture the function's arguments.
//!
//! The compiler would catch an unknown name by itself (the literal keeps the
//! caller's span, so `format!` resolves its captures among the arguments),
//! but its message does not know about the attribute, and a capture could
//! also find a constant or static of the same name. Checking here gives a
//! message that lists the arguments and keeps keys to what the issue
//! promises: a function of the arguments.

use syn::{Ident, LitStr};

use crate::errors::Errors;

/// One `{…}` of a template: the text before `:` (a name, a position, or
/// nothing).
#[derive(Debug, PartialEq, Eq)]
struct Capture<'a>(&'a str);

/// The captures of `template`, in order. `{{` and `}}` are escapes; text
/// the compiler will refuse anyway (an unclosed `{`) is left to it.
fn captures(template: &str) -> Vec<Capture<'_>> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        if let Some(escaped) = after.strip_prefix('{') {
            rest = escaped;
            continue;
        }
        let Some(close) = after.find('}') else {
            break;
        };
        let inside = &after[..close];
        let name = inside.split_once(':').map_or(inside, |(name, _)| name);
        found.push(Capture(name.trim()));
        rest = &after[close + 1..];
    }
    found
}

/// Checks that every capture of `template` names one of `arguments`;
/// `function` names the function in messages.
pub(crate) fn check_template(
    template: &LitStr,
    function: &Ident,
    arguments: &[Ident],
) -> syn::Result<()> {
    let mut errors = Errors::default();
    let value = template.value();
    let listed = if arguments.is_empty() {
        format!("`{function}` has no arguments")
    } else {
        let names: Vec<String> = arguments.iter().map(|a| format!("`{a}`")).collect();
        format!("the arguments of `{function}` are {}", names.join(", "))
    };
    for Capture(name) in captures(&value) {
        let is_name = name
            .chars()
            .next()
            .is_some_and(|c| c == '_' || c.is_alphabetic());
        if !is_name {
            errors.push(syn::Error::new(
                template.span(),
                format!(
                    "`{{{name}}}` in the key template captures no argument: name one, as in \
                     `{{order_id}}` ({listed}); for anything else, write `key = {{ … }}`"
                ),
            ));
        } else if !arguments.iter().any(|a| a == name.trim_start_matches("r#")) {
            errors.push(syn::Error::new(
                template.span(),
                format!(
                    "the key template captures `{name}`, which is not an argument: {listed}; \
                     for anything else (a field of `self`, a constant), write `key = {{ … }}`"
                ),
            ));
        }
    }
    errors.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    fn idents(names: &[&str]) -> Vec<Ident> {
        names
            .iter()
            .map(|n| Ident::new(n, Span::call_site()))
            .collect()
    }

    fn check(template: &str, arguments: &[&str]) -> Result<(), Vec<String>> {
        let literal = LitStr::new(template, Span::call_site());
        let function = Ident::new("pay", Span::call_site());
        check_template(&literal, &function, &idents(arguments))
            .map_err(|e| e.into_iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn captures_are_names_before_the_format_spec_and_escapes_are_skipped() {
        assert_eq!(
            captures("a{{b}}{c}:{d:>4}{{{e}}}{ f }{}{0}"),
            [
                Capture("c"),
                Capture("d"),
                Capture("e"),
                Capture("f"),
                Capture(""),
                Capture("0")
            ]
        );
        assert_eq!(captures("plain"), []);
        assert_eq!(captures("unclosed {x"), []);
    }

    #[test]
    fn templates_over_the_arguments_pass() {
        assert_eq!(
            check("order:{order_id}:{amount:?}", &["order_id", "amount"]),
            Ok(())
        );
        assert_eq!(check("fixed-name {{literally}}", &[]), Ok(()));
    }

    #[test]
    fn an_unknown_name_lists_the_arguments() {
        let errors = check("order:{orderid}", &["order_id", "amount"]).unwrap_err();
        assert_eq!(
            errors,
            [
                "the key template captures `orderid`, which is not an argument: the arguments \
              of `pay` are `order_id`, `amount`; for anything else (a field of `self`, a \
              constant), write `key = { … }`"
            ]
        );
        let errors = check("{x}", &[]).unwrap_err();
        assert!(errors[0].contains("`pay` has no arguments"), "{errors:?}");
    }

    #[test]
    fn positional_captures_are_refused() {
        let errors = check("order:{}:{0}", &["order_id"]).unwrap_err();
        assert_eq!(errors.len(), 2);
        assert!(errors[0].starts_with("`{}` in the key template captures no argument"));
        assert!(errors[1].starts_with("`{0}` in the key template captures no argument"));
    }
}

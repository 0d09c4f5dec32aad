//! The attribute's options: `#[locked(client = …, key = …, wait = "5s")]`.
//!
//! Each option is a `name = value` pair (or a bare name, for the flags in
//! [`FLAGS`]), parsed by one arm of [`Options::parse_option`] into one
//! field. A new option is an entry in [`OPTIONS`], a field, and an arm;
//! `expand` then decides what it calls at run time. A name not in
//! [`OPTIONS`] is refused with the list.
//!
//! Parsing never stops at the first mistake it can step over: every
//! problem of the list is reported at once, each at its own tokens.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, Lit, LitInt, LitStr, Path, Token};

use crate::duration;
use crate::errors::Errors;

/// Every option, with how it is written, for error messages.
const OPTIONS: &[(&str, &str)] = &[
    ("client", "client = LOCKS"),
    ("key", "key = \"order:{order_id}\""),
    ("keys", "keys = [\"account:{from}\", \"account:{to}\"]"),
    ("wait", "wait = \"5s\""),
    ("lease", "lease = \"30s\""),
    ("fixed_lease", "fixed_lease = \"30s\""),
    ("fencing", "fencing = token"),
    ("fair", "fair"),
    ("rw", "rw = read"),
    ("semaphore", "semaphore = 2"),
    ("crate", "crate = ::redbaton"),
];

/// The options that may be written without a value.
const FLAGS: &[&str] = &["fair", "semaphore"];

/// The longest lease the lock accepts (a year, as `Lock::with_lease`
/// checks again at run time).
const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The options of one attribute, checked.
pub(crate) struct Options {
    /// What gives the `redbaton::Client`.
    pub(crate) client: Expr,
    /// The lock's name, or the multi-lock's names.
    pub(crate) names: Names,
    /// `None`: one attempt.
    pub(crate) wait: Option<Duration>,
    pub(crate) lease: Lease,
    /// The local the body sees the fencing token as.
    pub(crate) fencing: Option<Ident>,
    /// What the function holds.
    pub(crate) kind: Kind,
    /// The path of the redbaton crate in the caller's code.
    pub(crate) krate: TokenStream,
}

/// What a locked function holds while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The lock (the default).
    Lock,
    /// `fair`: the fair lock.
    Fair,
    /// `rw = read`.
    Read,
    /// `rw = write`.
    Write,
    /// `semaphore` (1) or `semaphore = N`: permits of the semaphore.
    Semaphore(u64),
}

/// Where the lock's name comes from.
pub(crate) enum Key {
    /// `key = "order:{order_id}"`: a `format!` string over the arguments.
    Template(LitStr),
    /// `key = { … }` (or any other expression): its value.
    Expr(Expr),
}

/// What the function locks: one name (`key`) or several together (`keys`).
pub(crate) enum Names {
    /// `key = …`: one lock (or fair lock, read-write lock, semaphore).
    One(Key),
    /// `keys = [ … ]`: a multi-lock over these names, taken all or none;
    /// at least one.
    Many(Vec<Key>),
}

/// The lease the function's lock is kept with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// The client's `default_lease`, renewed.
    ClientDefault,
    /// `lease = "…"`: renewed.
    Renewed(Duration),
    /// `fixed_lease = "…"`: not renewed.
    Fixed(Duration),
}

/// The options as written, each kept with the name that set it.
#[derive(Default)]
struct Given {
    client: Option<Expr>,
    key: Option<Key>,
    /// With the name `keys`, for the errors that point at it.
    keys: Option<(Ident, Vec<Key>)>,
    wait: Option<Duration>,
    lease: Option<(Ident, Lease)>,
    fencing: Option<Ident>,
    kind: Option<(Ident, Kind)>,
    krate: Option<Path>,
    /// The names seen so far, to refuse one given twice.
    seen: Vec<String>,
}

impl Options {
    /// Parses and checks the attribute's tokens.
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Options> {
        let mut given = Given::default();
        let mut errors = Errors::default();
        let parser = |input: ParseStream<'_>| {
            while !input.is_empty() {
                Options::parse_option(input, &mut given, &mut errors)?;
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
            }
            Ok(())
        };
        let read_whole_list = match parser.parse2(tokens) {
            Ok(()) => true,
            Err(error) => {
                errors.push(error);
                false
            }
        };
        let kind = given.kind.as_ref().map_or(Kind::Lock, |(_, kind)| *kind);
        check_kind(&given, kind, &mut errors);
        // A `keys` whose list was refused is not missing.
        let named = given
            .seen
            .iter()
            .any(|name| name == "key" || name == "keys");
        let names = match (given.key, given.keys) {
            (Some(key), None) => Some(Names::One(key)),
            (None, Some((_, keys))) => Some(Names::Many(keys)),
            (Some(key), Some((keys, _))) => {
                errors.push(syn::Error::new(
                    keys.span(),
                    "`key` and `keys` exclude each other: `key` locks one name, `keys = [ … ]` \
                     locks several together (a multi-lock); keep one",
                ));
                Some(Names::One(key))
            }
            (None, None) => None,
        };
        match (given.client, names) {
            (Some(client), Some(names)) => {
                errors.finish()?;
                Ok(Options {
                    client,
                    names,
                    wait: given.wait,
                    lease: given.lease.map_or(Lease::ClientDefault, |(_, lease)| lease),
                    fencing: given.fencing,
                    kind,
                    krate: given
                        .krate
                        .map_or_else(|| quote!(::redbaton), |path| quote!(#path)),
                })
            }
            // What the list did not get to read is not known to be missing.
            (_, _) if !read_whole_list => Err(errors.into_error()),
            (client, names) => {
                if client.is_none() {
                    errors.push(syn::Error::new(
                        Span::call_site(),
                        "`#[redbaton::locked]` needs `client = …`: the `redbaton::Client` to \
                         lock with (a static such as `client = LOCKS`, a field such as \
                         `client = self.locks`, or a function call)",
                    ));
                }
                if names.is_none() && !named {
                    errors.push(syn::Error::new(
                        Span::call_site(),
                        "`#[redbaton::locked]` needs `key = …`: the lock's name, as a template \
                         of the arguments (`key = \"order:{order_id}\"`) or a block \
                         (`key = { … }`); or `keys = [ … ]` for several names locked together",
                    ));
                }
                Err(errors.into_error())
            }
        }
    }

    /// One `name = value`. A value that is wrong is recorded in `errors`
    /// and parsing goes on; a list that cannot be read further is `Err`.
    fn parse_option(
        input: ParseStream<'_>,
        given: &mut Given,
        errors: &mut Errors,
    ) -> syn::Result<()> {
        // `crate` is a keyword: read any identifier.
        let name = input.call(Ident::parse_any)?;
        let text = name.to_string();
        if !OPTIONS.iter().any(|(known, _)| *known == text) {
            return Err(unknown_option(&name));
        }
        let has_value = input.peek(Token![=]);
        if !has_value && !FLAGS.contains(&text.as_str()) {
            return Err(syn::Error::new(
                name.span(),
                format!("`{text}` takes a value: `{}`", example(&name)),
            ));
        }
        if has_value {
            input.parse::<Token![=]>()?;
        }
        if given.seen.contains(&text) {
            errors.push(syn::Error::new(
                name.span(),
                format!("`{text}` is given twice; keep one"),
            ));
        }
        given.seen.push(text.clone());
        match text.as_str() {
            "client" => given.client = Some(input.parse()?),
            "key" => given.key = Some(key(input.parse()?)),
            "keys" => {
                let value: Expr = input.parse()?;
                match value {
                    Expr::Array(list) if list.elems.is_empty() => {
                        errors.push(syn::Error::new_spanned(
                            list,
                            "`keys` needs at least one name: `keys = [\"account:{from}\", \
                             \"account:{to}\"]`",
                        ))
                    }
                    Expr::Array(list) => {
                        given.keys = Some((name, list.elems.into_iter().map(key).collect()));
                    }
                    other => errors.push(syn::Error::new_spanned(
                        other,
                        "`keys` takes a list in brackets, each name a template of the \
                         arguments or a block, as in `keys = [\"account:{from}\", \
                         \"account:{to}\"]`; for one name, write `key = …`",
                    )),
                }
            }
            "wait" => {
                let wait = duration_value(input, &name)?;
                match wait {
                    Ok((_, wait)) => given.wait = Some(wait),
                    Err(error) => errors.push(error),
                }
            }
            "lease" | "fixed_lease" => match duration_value(input, &name)? {
                Ok((literal, lease)) => {
                    if lease.is_zero() || lease > MAX_LEASE {
                        errors.push(syn::Error::new(
                            literal.span(),
                            format!(
                                "a lease must be between 1ms and a year, not {:?}",
                                literal.value()
                            ),
                        ));
                    }
                    if let Some((other, _)) = &given.lease {
                        errors.push(syn::Error::new(
                            name.span(),
                            format!(
                                "`{text}` and `{other}` exclude each other (`lease` is renewed \
                                 while the function runs, `fixed_lease` ends on time); keep one"
                            ),
                        ));
                    }
                    let lease = if text == "lease" {
                        Lease::Renewed(lease)
                    } else {
                        Lease::Fixed(lease)
                    };
                    given.lease = Some((name, lease));
                }
                Err(error) => errors.push(error),
            },
            "fencing" => {
                let value: Expr = input.parse()?;
                match &value {
                    Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => {
                        given.fencing = path.path.get_ident().cloned();
                    }
                    _ => errors.push(syn::Error::new_spanned(
                        value,
                        "`fencing` takes the name of a local for the fencing token, \
                         as in `fencing = token`",
                    )),
                }
            }
            "fair" => {
                if has_value {
                    let value: Expr = input.parse()?;
                    errors.push(syn::Error::new_spanned(
                        value,
                        "`fair` takes no value: write `fair` to hold the fair lock",
                    ));
                }
                set_kind(given, errors, name, Kind::Fair);
            }
            "rw" => {
                let value: Expr = input.parse()?;
                let mode = match &value {
                    Expr::Path(path) if path.path.is_ident("read") => Some(Kind::Read),
                    Expr::Path(path) if path.path.is_ident("write") => Some(Kind::Write),
                    _ => None,
                };
                match mode {
                    Some(mode) => set_kind(given, errors, name, mode),
                    None => errors.push(syn::Error::new_spanned(
                        value,
                        "`rw` is `read` or `write`: `rw = read` holds the read-write lock for \
                         reading, `rw = write` for writing",
                    )),
                }
            }
            "semaphore" => {
                let permits = if has_value {
                    let value: Expr = input.parse()?;
                    match &value {
                        Expr::Lit(syn::ExprLit {
                            lit: Lit::Int(count),
                            ..
                        }) => permits(count, errors),
                        _ => {
                            errors.push(syn::Error::new_spanned(
                                value,
                                "`semaphore` takes how many permits to hold, as a number: \
                                 `semaphore = 2` (or `semaphore` alone for one)",
                            ));
                            1
                        }
                    }
                } else {
                    1
                };
                set_kind(given, errors, name, Kind::Semaphore(permits));
            }
            "crate" => given.krate = Some(input.call(Path::parse_mod_style)?),
            _ => unreachable!("every name of OPTIONS has an arm"),
        }
        Ok(())
    }
}

/// One name: a string literal is a template over the arguments, anything
/// else an expression giving the name.
fn key(value: Expr) -> Key {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(template),
            ..
        }) => Key::Template(template),
        expr => Key::Expr(expr),
    }
}

/// A duration option's value: the literal and its duration, or the error
/// to report at it. `Err` only when the list cannot be read further.
fn duration_value(
    input: ParseStream<'_>,
    name: &Ident,
) -> syn::Result<Result<(LitStr, Duration), syn::Error>> {
    let value: Expr = input.parse()?;
    let Expr::Lit(syn::ExprLit {
        lit: Lit::Str(literal),
        ..
    }) = value
    else {
        return Ok(Err(syn::Error::new_spanned(
            value,
            format!(
                "`{name}` takes a duration in quotes, as in `{}`; {}",
                example(name),
                duration::GRAMMAR
            ),
        )));
    };
    Ok(match duration::parse(&literal.value()) {
        Ok(duration) if duration.is_zero() && name == "wait" => Err(syn::Error::new(
            literal.span(),
            "a wait of zero is one attempt, which is what leaving `wait` out does: remove it",
        )),
        Ok(duration) => Ok((literal, duration)),
        Err(message) => Err(syn::Error::new(literal.span(), message)),
    })
}

/// Records what the function holds; `fair`, `rw` and `semaphore` exclude
/// each other.
fn set_kind(given: &mut Given, errors: &mut Errors, name: Ident, kind: Kind) {
    if let Some((other, _)) = &given.kind {
        errors.push(syn::Error::new(
            name.span(),
            format!(
                "`{name}` and `{other}` exclude each other: a function holds one thing \
                 (the lock by default, or `fair`, `rw = …` or `semaphore`); keep one"
            ),
        ));
        return;
    }
    given.kind = Some((name, kind));
}

/// A semaphore option's permit count: at least 1.
fn permits(count: &LitInt, errors: &mut Errors) -> u64 {
    match count.base10_parse::<u64>() {
        Ok(permits) if permits >= 1 => permits,
        _ => {
            errors.push(syn::Error::new(
                count.span(),
                "a function holds at least 1 permit: `semaphore = 1` or more",
            ));
            1
        }
    }
}

/// The options that only some kinds take: a renewed lease of its own length
/// (`Lock::with_lease`) is the lock's; a fencing token, the lock's and the
/// writer's.
fn check_kind(given: &Given, kind: Kind, errors: &mut Errors) {
    // A multi-lock is made of plain locks: there is no fair, read-write or
    // semaphore one.
    if let (Some(_), Some((other, _))) = (&given.keys, &given.kind) {
        errors.push(syn::Error::new(
            other.span(),
            format!(
                "`{other}` cannot go with `keys`: `keys = [ … ]` holds a multi-lock, made of \
                 plain locks, and there is no fair, read-write or semaphore multi-lock; \
                 use `key` for one name with `{other}`, or leave `{other}` out"
            ),
        ));
    }
    if let Some((lease, Lease::Renewed(_))) = &given.lease {
        if !matches!(kind, Kind::Lock | Kind::Fair) {
            errors.push(syn::Error::new(
                lease.span(),
                "`lease` (renewed, of its own length) is for the lock and the fair lock; the \
                 read-write lock and the semaphore are renewed with the client's \
                 `default_lease`: leave it out, or use `fixed_lease`",
            ));
        }
    }
    if let Some(fencing) = &given.fencing {
        if matches!(kind, Kind::Read | Kind::Semaphore(_)) {
            errors.push(syn::Error::new(
                fencing.span(),
                "`fencing` gives the fencing token of a lock or of `rw = write`; a read hold \
                 and semaphore permits have none",
            ));
        }
    }
}

/// How option `name` (one of [`OPTIONS`]) is written.
fn example(name: &Ident) -> &'static str {
    OPTIONS
        .iter()
        .find(|(known, _)| name == known)
        .map_or("", |(_, example)| example)
}

/// The error for a name that is not an option.
fn unknown_option(name: &Ident) -> syn::Error {
    let known: Vec<String> = OPTIONS
        .iter()
        .map(|(known, _)| format!("`{known}`"))
        .collect();
    syn::Error::new(
        name.span(),
        format!(
            "unknown option `{name}` of `#[redbaton::locked]`; the options are {}",
            known.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(tokens: TokenStream) -> syn::Result<Options> {
        Options::parse(tokens)
    }

    fn messages(tokens: TokenStream) -> Vec<String> {
        let Err(errors) = parse(tokens) else {
            panic!("the options were accepted");
        };
        errors.into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn every_option_is_read() {
        let options = parse(quote!(
            client = LOCKS,
            key = "order:{id}",
            wait = "5s",
            lease = "30s",
            fencing = token,
            crate = ::my::redbaton,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(options.names, Names::One(Key::Template(_))));
        assert_eq!(options.wait, Some(Duration::from_secs(5)));
        assert_eq!(options.lease, Lease::Renewed(Duration::from_secs(30)));
        assert_eq!(options.fencing.unwrap().to_string(), "token");
        assert_eq!(
            options.krate.to_string(),
            quote!(::my::redbaton).to_string()
        );

        let options = parse(quote!(client = self.c, key = { x() }, fixed_lease = "2m"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            options.names,
            Names::One(Key::Expr(Expr::Block(_)))
        ));
        assert_eq!(options.wait, None);
        assert_eq!(options.lease, Lease::Fixed(Duration::from_secs(120)));
        assert_eq!(options.krate.to_string(), quote!(::redbaton).to_string());
    }

    #[test]
    fn an_unknown_option_lists_the_known_ones() {
        for name in ["fairness", "mode", "permits", "timeout"] {
            let name = Ident::new(name, Span::call_site());
            let errors = messages(quote!(client = C, key = "k", #name = true));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].starts_with(&format!("unknown option `{name}`")));
            for (known, _) in OPTIONS {
                assert!(errors[0].contains(&format!("`{known}`")), "{errors:?}");
            }
        }
    }

    #[test]
    fn every_mistake_of_a_list_is_reported_at_once() {
        let errors = messages(quote!(
            wait = "5 s",
            lease = "0ms",
            fixed_lease = "1s",
            fencing = 3
        ));
        assert_eq!(errors.len(), 6, "{errors:?}");
        assert!(errors[0].contains("\"5 s\" is not a duration"));
        assert!(errors[1].contains("between 1ms and a year"));
        assert!(errors[2].contains("exclude each other"));
        assert!(errors[3].contains("name of a local"));
        assert!(errors[4].contains("needs `client = …`"));
        assert!(errors[5].contains("needs `key = …`"));
    }

    #[test]
    fn an_option_given_twice_or_without_a_value_is_refused() {
        let errors = messages(quote!(client = A, client = B, key = "k"));
        assert_eq!(errors, ["`client` is given twice; keep one"]);
        let errors = messages(quote!(client = A, key));
        assert_eq!(
            errors[0],
            "`key` takes a value: `key = \"order:{order_id}\"`"
        );
    }

    #[test]
    fn the_kind_of_hold_is_read_and_checked() {
        let kind = |tokens: TokenStream| parse(tokens).unwrap_or_else(|e| panic!("{e}")).kind;
        assert_eq!(kind(quote!(client = C, key = "k")), Kind::Lock);
        assert_eq!(kind(quote!(client = C, key = "k", fair)), Kind::Fair);
        assert_eq!(kind(quote!(client = C, key = "k", rw = read)), Kind::Read);
        assert_eq!(kind(quote!(rw = write, client = C, key = "k")), Kind::Write);
        assert_eq!(
            kind(quote!(client = C, key = "k", semaphore)),
            Kind::Semaphore(1)
        );
        assert_eq!(
            kind(quote!(client = C, key = "k", semaphore = 3)),
            Kind::Semaphore(3)
        );
        assert_eq!(
            kind(quote!(
                client = C,
                key = "k",
                fair,
                lease = "5s",
                fencing = t
            )),
            Kind::Fair
        );

        let errors = messages(quote!(client = C, key = "k", fair, rw = read));
        assert!(errors[0].contains("exclude each other"), "{errors:?}");
        let errors = messages(quote!(client = C, key = "k", rw = both));
        assert!(
            errors[0].starts_with("`rw` is `read` or `write`"),
            "{errors:?}"
        );
        let errors = messages(quote!(client = C, key = "k", semaphore = 0));
        assert!(errors[0].contains("at least 1 permit"), "{errors:?}");
        let errors = messages(quote!(client = C, key = "k", semaphore = "2"));
        assert!(errors[0].contains("as a number"), "{errors:?}");
        let errors = messages(quote!(client = C, key = "k", fair = true));
        assert!(errors[0].starts_with("`fair` takes no value"), "{errors:?}");
        let errors = messages(quote!(
            client = C,
            key = "k",
            rw = read,
            lease = "5s",
            fencing = t
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("`lease` (renewed, of its own length)"));
        assert!(errors[1].starts_with("`fencing` gives the fencing token"));
        let errors = messages(quote!(client = C, key = "k", semaphore, fencing = t));
        assert!(errors[0].starts_with("`fencing` gives the fencing token"));
        // A fixed lease and a writer's token are fine.
        parse(quote!(
            client = C,
            key = "k",
            rw = write,
            fixed_lease = "5s",
            fencing = t
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn keys_take_a_multi_lock_with_the_lock_options_only() {
        let options = parse(quote!(
            client = C,
            keys = ["a:{x}", { b() }],
            wait = "1s",
            fixed_lease = "5s",
            fencing = tokens
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let Names::Many(keys) = &options.names else {
            panic!("not a multi-lock");
        };
        assert!(matches!(
            keys[..],
            [Key::Template(_), Key::Expr(Expr::Block(_))]
        ));
        assert_eq!(options.kind, Kind::Lock);
        parse(quote!(client = C, keys = ["a"], lease = "5s")).unwrap_or_else(|e| panic!("{e}"));

        let errors = messages(quote!(client = C, key = "a", keys = ["b"]));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`key` and `keys` exclude each other"));
        let errors = messages(quote!(client = C, keys = []));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`keys` needs at least one name"));
        let errors = messages(quote!(client = C, keys = "a"));
        assert!(errors[0].starts_with("`keys` takes a list in brackets"));
        for kind in [quote!(fair), quote!(rw = read), quote!(semaphore = 2)] {
            let errors = messages(quote!(client = C, keys = ["a", "b"], #kind));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].contains("cannot go with `keys`"), "{errors:?}");
        }
        let errors = messages(quote!(client = C));
        assert!(errors[0].contains("or `keys = [ … ]`"), "{errors:?}");
    }

    #[test]
    fn durations_must_be_quoted_and_waits_not_zero() {
        let errors = messages(quote!(client = A, key = "k", wait = 5));
        assert!(errors[0].starts_with("`wait` takes a duration in quotes"));
        let errors = messages(quote!(client = A, key = "k", wait = "0ms"));
        assert!(errors[0].starts_with("a wait of zero is one attempt"));
        let errors = messages(quote!(client = A, key = "k", lease = "9000h"));
        assert!(errors[0].contains("between 1ms and a year"));
    }
}

//! Compile-pass and compile-fail tests of `#[redbaton::locked]`: every
//! option in `ui/pass`, every error message in `ui/fail` (each `.rs` beside
//! the `.stderr` the compiler must print). After changing a message,
//! `TRYBUILD=overwrite cargo test --features macros --test macros compile`
//! rewrites the `.stderr` files; read the diff before committing it.

#[test]
fn compile_pass_and_compile_fail() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/macros/ui/pass/*.rs");
    cases.compile_fail("tests/macros/ui/fail/*.rs");
}

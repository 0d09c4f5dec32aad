//! Keys: templates over every kind of argument pattern, with format specs
//! and escaped braces; blocks giving any kind of string.

use std::borrow::Cow;
use std::sync::Arc;

use redbaton::{Client, Error};

const TENANT: &str = "acme";

struct Point {
    x: i32,
    y: i32,
}

#[redbaton::locked(client = c, key = "{{literal}}:{a}:{b:?}:{x}/{y}:{first}:{n:04}")]
fn patterns(c: &Client, (a, b): (u8, &str), Point { x, y }: Point, [first, ..]: [u8; 2], mut n: u32) -> Result<(), Error> {
    n += 1;
    let _ = (a, b, x, y, first, n);
    Ok(())
}

#[redbaton::locked(client = c, key = { format!("{TENANT}:{id}") })]
fn string_block(c: &Client, id: u32) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = { "nightly" })]
fn str_block(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = TENANT)]
fn constant(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = name)]
fn borrowed_string(c: &Client, name: &String) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = { Cow::Borrowed("cow") })]
fn cow(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = { Arc::<str>::from("arc") })]
fn arc(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = { Box::<str>::from("box") })]
fn boxed(c: &Client) -> Result<(), Error> {
    Ok(())
}

#[redbaton::locked(client = c, key = "fixed")]
fn no_captures(c: &Client) -> Result<(), Error> {
    Ok(())
}

fn main() {
    let _ = (patterns, string_block, str_block, constant, borrowed_string);
    let _ = (cow, arc, boxed, no_captures);
}

//! The count-down latch's scripts' KEYS and ARGV, each encoded in one
//! place, and the waiter's look at the latch decoded. The `.lua` files
//! document what each argument means.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::{millis, Call, LATCH_COUNT_DOWN, LATCH_SET_COUNT, LATCH_WAIT};
use crate::keys::LatchKeys;

/// Starts a round at `count` under the new round id `round`, unless the
/// latch is still counting.
pub(crate) fn set_count(keys: &LatchKeys, count: u64, round: &str) -> Call {
    Call::new(&LATCH_SET_COUNT)
        .key(&keys.count)
        .key(&keys.round)
        .key(&keys.applied)
        .arg(count)
        .arg(round)
}

/// What a count-down sends besides the keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CountDownArgs<'a> {
    /// Unique per call: a resend counts once.
    pub(crate) id: &'a str,
    /// The round it is meant for: it never counts in another.
    pub(crate) round: &'a str,
    pub(crate) baton_ttl: Duration,
    /// How long an ended round's id is kept.
    pub(crate) ended_round_kept: Duration,
}

/// Counts one down in `args.round`, once per `args.id` however often it
/// is sent.
pub(crate) fn count_down(keys: &LatchKeys, args: CountDownArgs<'_>) -> Call {
    Call::new(&LATCH_COUNT_DOWN)
        .key(&keys.count)
        .key(&keys.round)
        .key(&keys.applied)
        .key(&keys.baton(args.round))
        .arg(args.id)
        .arg(args.round)
        .arg(millis(args.baton_ttl))
        .arg(millis(args.ended_round_kept))
}

/// Whether the latch is open: a first look (`round` `None`), or the look
/// of a waiter of `round` that was parked on its baton and passes the
/// token on.
pub(crate) fn wait(keys: &LatchKeys, round: Option<&str>, baton_ttl: Duration) -> Call {
    let call = Call::new(&LATCH_WAIT).key(&keys.count).key(&keys.round);
    match round {
        None => call.arg("").arg("0").arg(millis(baton_ttl)),
        Some(round) => call
            .key(&keys.baton(round))
            .arg(round)
            .arg("1")
            .arg(millis(baton_ttl)),
    }
}

/// What `latch/wait.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Look {
    /// The count is zero, or the waiter's round has ended.
    Open,
    /// Round `round` is still counting.
    Counting { round: String },
}

impl FromRedisValue for Look {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply: Vec<Value> = FromRedisValue::from_redis_value(value)?;
        match &reply[..] {
            [open] if i64::from_redis_value(open.clone())? == 1 => Ok(Look::Open),
            [counting, round] if i64::from_redis_value(counting.clone())? == 0 => {
                Ok(Look::Counting {
                    round: String::from_redis_value(round.clone())?,
                })
            }
            _ => Err(format!("unexpected reply {reply:?} from latch/wait.lua").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_decode_both_shapes() {
        let open = Value::Array(vec![Value::Int(1)]);
        assert_eq!(Look::from_redis_value(open).unwrap(), Look::Open);
        let counting = Value::Array(vec![Value::Int(0), Value::BulkString(b"a:1".to_vec())]);
        assert_eq!(
            Look::from_redis_value(counting).unwrap(),
            Look::Counting {
                round: "a:1".to_owned()
            }
        );
        assert!(Look::from_redis_value(Value::Array(vec![Value::Int(7)])).is_err());
    }
}

//! The lock scripts' replies, decoded in one place each, next to the type
//! (the `.lua` files document them).

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

/// What `lock/acquire.lua` (or `fair/acquire.lua`) answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Taken afresh (depth 1) or re-entered, under `fence`.
    /// `next_in_line`: a fair lock taken afresh while others wait, the
    /// waiter first in its queue now (whom the release will likely wake).
    /// `line`: the waiters of the caller's client first in that queue,
    /// which the ownership may pass along in memory (see
    /// `fair/acquire.lua`).
    Acquired {
        fence: u64,
        depth: u64,
        next_in_line: Option<String>,
        line: Line,
    },
    /// Held by another identity, whose lease ends in `lease_left` (`None`:
    /// the key has no expiry). `arrival`: a fair lock's waiter's arrival
    /// in the queue (server µs; 0 for none, and for the plain lock), sent
    /// back with its next attempts. `handing_over`: nobody holds the plain
    /// lock, which is kept for `lease_left` for a waiter that asked before
    /// the caller (its hand-over window). `heads_list`: the caller is the
    /// head of a fair lock's queue behind a holder, and parks on the
    /// head's list ([`FairKeys::next`](crate::keys::FairKeys::next)).
    Held {
        lease_left: Option<Duration>,
        arrival: u64,
        handing_over: bool,
        heads_list: bool,
    },
}

/// A fair lock's line of waiters for a run of in-memory hand-offs
/// (`fair/acquire.lua`'s `line` and `after`): the waiters of the
/// acquiring thread's client first in the queue behind it, in order, with
/// their arrivals; and the waiter behind them, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) waiters: Vec<(String, u64)>,
    pub(crate) after: Option<String>,
}

impl Line {
    /// `fair/acquire.lua`'s `line` (waiter, arrival, ...) and `after`.
    fn parse(line: Value, after: Option<Value>) -> Result<Self, ParsingError> {
        let items: Vec<Value> = FromRedisValue::from_redis_value(line)?;
        let mut waiters = Vec::with_capacity(items.len() / 2);
        let mut items = items.into_iter();
        while let (Some(waiter), Some(arrival)) = (items.next(), items.next()) {
            waiters.push((
                String::from_redis_value(waiter)?,
                u64::from_redis_value(arrival)?,
            ));
        }
        let after = after.map(String::from_redis_value).transpose()?;
        Ok(Line { waiters, after })
    }

    /// The line a grant passed along (`fair/release.lua`'s `<behind>`:
    /// `<waiter>,<arrival>,...;<next>`, where `<next>` is the waiter after
    /// the line, or, with no line, the first waiter behind the grantee),
    /// and the first waiter behind the grantee. `None`: not one.
    pub(crate) fn of_grant(behind: &str) -> Option<(Line, Option<String>)> {
        let (line, next) = behind.split_once(';')?;
        let next = (!next.is_empty()).then(|| next.to_owned());
        let mut waiters = Vec::new();
        if !line.is_empty() {
            let mut items = line.split(',');
            while let Some(waiter) = items.next() {
                let arrival = items.next()?.parse().ok()?;
                waiters.push((waiter.to_owned(), arrival));
            }
        }
        let Some((first, _)) = waiters.first() else {
            return Some((Line::default(), next));
        };
        let first = Some(first.clone());
        Some((
            Line {
                waiters,
                after: next,
            },
            first,
        ))
    }
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut items: Vec<Value> = FromRedisValue::from_redis_value(value)?;
        // Only a fair lock's fresh acquisition has a name fourth: the next
        // in line, then perhaps its line of waiters and the one after.
        let mut next_in_line = None;
        let mut line = Line::default();
        if let Some(Value::BulkString(_) | Value::SimpleString(_)) = items.get(3) {
            let mut tail = items.split_off(3).into_iter();
            next_in_line = tail.next().map(String::from_redis_value).transpose()?;
            if let Some(waiters) = tail.next() {
                line = Line::parse(waiters, tail.next())?;
            }
        }
        let reply = i64::from_redis_values(items)?;
        match reply[..] {
            [1, fence, depth] => Ok(AcquireReply::Acquired {
                fence: fence.unsigned_abs(),
                depth: depth.unsigned_abs(),
                next_in_line,
                line,
            }),
            _ if next_in_line.is_some() => {
                Err(format!("unexpected reply {reply:?} and a name from fair/acquire.lua").into())
            }
            // A plain lock's hand-over window: `-1` where a fair lock's
            // arrival goes.
            [0, pttl, -1] => Ok(AcquireReply::Held {
                lease_left: u64::try_from(pttl).ok().map(Duration::from_millis),
                arrival: 0,
                handing_over: true,
                heads_list: false,
            }),
            [0, pttl] | [0, pttl, _] | [0, pttl, _, 0 | 1] => Ok(AcquireReply::Held {
                lease_left: u64::try_from(pttl).ok().map(Duration::from_millis),
                arrival: reply.get(2).map_or(0, |arrival| arrival.unsigned_abs()),
                handing_over: false,
                heads_list: reply.get(3) == Some(&1),
            }),
            _ => Err(unexpected("lock/acquire.lua", &reply)),
        }
    }
}

/// What `lock/acquire_many.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ManyReply {
    /// Every name taken or re-entered: (fence, depth) per name, in the
    /// order of the call's names.
    Acquired(Vec<(u64, u64)>),
    /// The name at `index` (0-based) is held by another identity, whose
    /// lease ends in `lease_left` (`None`: no expiry), or (`handing_over`)
    /// kept that long in its hand-over window for a waiter that asked
    /// before the caller. Nothing was taken.
    Held {
        index: usize,
        lease_left: Option<Duration>,
        handing_over: bool,
    },
}

impl FromRedisValue for ManyReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply: Vec<i64> = FromRedisValue::from_redis_value(value)?;
        match reply[..] {
            [0, index, pttl] | [0, index, pttl, -1] if index >= 1 => Ok(ManyReply::Held {
                index: usize::try_from(index - 1).unwrap_or(usize::MAX),
                lease_left: u64::try_from(pttl).ok().map(Duration::from_millis),
                handing_over: reply.len() == 4,
            }),
            [1, ref pairs @ ..] if !pairs.is_empty() && pairs.len() % 2 == 0 => {
                Ok(ManyReply::Acquired(
                    pairs
                        .chunks_exact(2)
                        .map(|pair| (pair[0].unsigned_abs(), pair[1].unsigned_abs()))
                        .collect(),
                ))
            }
            _ => Err(unexpected("lock/acquire_many.lua", &reply)),
        }
    }
}

/// What `lock/release.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// The last guard: the lock is free and the baton pushed.
    Released,
    /// An inner guard: the lock is still held at this depth.
    Inner { depth: u64 },
    /// The caller does not own the lock; nothing changed.
    NotOwner,
    /// Never a script's reply: a Redlock quorum's last release that freed
    /// the lock on a majority while some masters did not answer (or were
    /// left out as suspect). The lock is free, but those masters may still
    /// hold their copy, and waiters parked there hear no baton until it
    /// expires: the release must reach them in the background.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    ReleasedInPart,
}

impl FromRedisValue for ReleaseReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        Ok(match i64::from_redis_value(value)? {
            0 => ReleaseReply::Released,
            -1 => ReleaseReply::NotOwner,
            depth => ReleaseReply::Inner {
                depth: depth.unsigned_abs(),
            },
        })
    }
}

/// What a fair lock's script that may free the lock answered (`fair/`
/// release, release_request, force_unlock, leave): its own reply, the
/// waiter to wake next (`None`: nobody), and the list it parks on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FairReply<T> {
    pub(crate) reply: T,
    pub(crate) wake: Option<String>,
    pub(crate) parked_on: ParkedOn,
}

/// Which list the waiter a fair lock's script named to wake parks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParkedOn {
    /// Its own (`LockKeys::wake_list`).
    Own,
    /// The head's list (`FairKeys::next`).
    Heads,
    /// Not known (a script that does not say, or a lock found free): on
    /// either.
    Either,
}

impl<T: FromRedisValue> FromRedisValue for FairReply<T> {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut items: Vec<Value> = FromRedisValue::from_redis_value(value)?;
        let parked_on = match items.len() {
            2 => ParkedOn::Either,
            3 => match i64::from_redis_value(items.pop().unwrap_or(Value::Nil))? {
                0 => ParkedOn::Own,
                1 => ParkedOn::Heads,
                _ => ParkedOn::Either,
            },
            n => return Err(format!("a fair lock script's reply of {n} elements").into()),
        };
        let head = String::from_redis_value(items.pop().unwrap_or(Value::Nil))?;
        let reply = T::from_redis_value(items.pop().unwrap_or(Value::Nil))?;
        Ok(FairReply {
            reply,
            wake: Some(head).filter(|head| !head.is_empty()),
            parked_on,
        })
    }
}

/// What `lock/handoff.lua` (or `fair/handoff.lua`) answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandoffReply {
    /// The waiter's new fencing token, or `None` when nothing was handed
    /// over: the releaser no longer owned the lock, or (`not_head`) the
    /// waiter was not the head of a fair lock's queue.
    pub(crate) fence: Option<u64>,
    /// A fair lock's hand-off: the head of the queue behind the waiter,
    /// whom the waiter's release will likely wake.
    pub(crate) next_in_line: Option<String>,
    /// A fair lock's waiter was not the head of its queue: nothing was
    /// changed, and the holder releases as usual.
    pub(crate) not_head: bool,
    /// Never set by a script: a Redlock quorum's hand-off that a majority
    /// made while other masters did not answer. The giver's copy may still
    /// stand on those, asleep waiters parked there: it is released in the
    /// background.
    pub(crate) in_part: bool,
}

impl HandoffReply {
    /// A whole hand-off's reply: `fence`, or `None` (not the owner).
    pub(crate) fn to(fence: Option<u64>) -> Self {
        HandoffReply {
            fence,
            next_in_line: None,
            not_head: false,
            in_part: false,
        }
    }
}

impl FromRedisValue for HandoffReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let Value::Array(mut items) = value else {
            return Ok(HandoffReply::to(
                u64::try_from(i64::from_redis_value(value)?).ok(),
            ));
        };
        // The fair lock's: `{fence, next}`, `{-1}` or `{0}`.
        let next_in_line = match items.len() {
            2 => Some(String::from_redis_value(items.pop().unwrap_or(Value::Nil))?)
                .filter(|next| !next.is_empty()),
            _ => None,
        };
        match i64::from_redis_values(items)?[..] {
            [-1] => Ok(HandoffReply::to(None)),
            [0] => Ok(HandoffReply {
                not_head: true,
                ..HandoffReply::to(None)
            }),
            [fence] if fence > 0 => Ok(HandoffReply {
                next_in_line,
                ..HandoffReply::to(Some(fence.unsigned_abs()))
            }),
            ref reply => Err(unexpected("fair/handoff.lua", reply)),
        }
    }
}

/// What `lock/holder.lua` answered: `None` when the lock is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderReply(pub(crate) Option<HolderRow>);

/// One holder, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderRow {
    pub(crate) owner: String,
    pub(crate) depth: u32,
    pub(crate) fence: u64,
    /// `None`: the key has no expiry.
    pub(crate) lease_left: Option<Duration>,
}

impl FromRedisValue for HolderReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let row: Vec<Value> = FromRedisValue::from_redis_value(value)?;
        if row.is_empty() {
            return Ok(HolderReply(None));
        }
        let (owner, depth, fence, pttl): (String, u32, u64, i64) =
            FromRedisValue::from_redis_value(Value::Array(row))?;
        Ok(HolderReply(Some(HolderRow {
            owner,
            depth,
            fence,
            lease_left: u64::try_from(pttl).ok().map(Duration::from_millis),
        })))
    }
}

/// A script's `1` (done) or `0` (nothing to do): renew.lua,
/// force_unlock.lua, release_request.lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done(pub(crate) bool);

impl FromRedisValue for Done {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        Ok(Done(i64::from_redis_value(value)? == 1))
    }
}

/// What `rate/acquire.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeReply {
    /// Granted (or, for zero permits, read); `left` whole permits remain.
    Granted { left: u64 },
    /// Refused; the permits will exist after `wait` if no one takes them.
    Refused { wait: Duration },
    /// The limiter has no configuration.
    NotConfigured,
    /// More permits were asked for than the bucket holds.
    OverCapacity { capacity: u64 },
    /// The configuration's `field` is missing or malformed.
    Damaged { field: &'static str },
}

impl FromRedisValue for TakeReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply: Vec<i64> = FromRedisValue::from_redis_value(value)?;
        Ok(match reply[..] {
            [1, left, _] => TakeReply::Granted {
                left: left.unsigned_abs(),
            },
            [0, _, wait_us] => TakeReply::Refused {
                wait: Duration::from_micros(wait_us.unsigned_abs().max(1)),
            },
            [-1, _, _] => TakeReply::NotConfigured,
            [-2, capacity, _] => TakeReply::OverCapacity {
                capacity: capacity.unsigned_abs(),
            },
            [-3, field, _] => TakeReply::Damaged {
                field: match field {
                    1 => "mode",
                    2 => "permits",
                    _ => "per_us",
                },
            },
            _ => return Err(unexpected("rate/acquire.lua", &reply)),
        })
    }
}

fn unexpected(script: &str, reply: &[i64]) -> ParsingError {
    format!("unexpected reply {reply:?} from {script}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    #[test]
    fn a_grants_line_reads_back_as_a_fresh_acquisitions() {
        let line = |waiters: &[(&str, u64)], after: Option<&str>| Line {
            waiters: waiters.iter().map(|&(w, a)| (w.to_owned(), a)).collect(),
            after: after.map(str::to_owned),
        };
        let some = |waiter: &str| Some(waiter.to_owned());
        assert_eq!(Line::of_grant(";"), Some((Line::default(), None)));
        assert_eq!(Line::of_grant(";b:1"), Some((Line::default(), some("b:1"))));
        assert_eq!(
            Line::of_grant("a:2,100,a:3,200;b:1"),
            Some((
                line(&[("a:2", 100), ("a:3", 200)], Some("b:1")),
                some("a:2")
            ))
        );
        assert_eq!(
            Line::of_grant("a:2,100;"),
            Some((line(&[("a:2", 100)], None), some("a:2")))
        );
        for broken in ["", "a:2", "a:2;", "a:2,x;", "a:2,1,a:3;"] {
            assert_eq!(Line::of_grant(broken), None, "{broken}");
        }
    }

    #[test]
    fn replies_decode_every_documented_shape() {
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[1, 42, 2])).unwrap(),
            AcquireReply::Acquired {
                fence: 42,
                depth: 2,
                next_in_line: None,
                line: Line::default(),
            }
        );
        let mut fresh = vec![Value::Int(1), Value::Int(43), Value::Int(1)];
        fresh.push(Value::BulkString(b"c:7".to_vec()));
        assert_eq!(
            AcquireReply::from_redis_value(Value::Array(fresh)).unwrap(),
            AcquireReply::Acquired {
                fence: 43,
                depth: 1,
                next_in_line: Some("c:7".into()),
                line: Line::default(),
            }
        );
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let line = Value::Array(vec![
            bulk("a:2"),
            Value::Int(1_764_000_000_000_001),
            bulk("a:3"),
            Value::Int(1_764_000_000_000_002),
        ]);
        let with_line = |after: Option<Value>| {
            let mut reply = vec![Value::Int(1), bulk("44"), Value::Int(1), bulk("a:2")];
            reply.push(line.clone());
            reply.extend(after);
            AcquireReply::from_redis_value(Value::Array(reply)).unwrap()
        };
        let waiters = vec![
            ("a:2".to_owned(), 1_764_000_000_000_001),
            ("a:3".to_owned(), 1_764_000_000_000_002),
        ];
        assert_eq!(
            with_line(None),
            AcquireReply::Acquired {
                fence: 44,
                depth: 1,
                next_in_line: Some("a:2".into()),
                line: Line {
                    waiters: waiters.clone(),
                    after: None
                },
            }
        );
        assert_eq!(
            with_line(Some(bulk("b:9"))),
            AcquireReply::Acquired {
                fence: 44,
                depth: 1,
                next_in_line: Some("a:2".into()),
                line: Line {
                    waiters,
                    after: Some("b:9".into())
                },
            }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[0, -1])).unwrap(),
            AcquireReply::Held {
                lease_left: None,
                arrival: 0,
                handing_over: false,
                heads_list: false
            }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[0, 80, -1])).unwrap(),
            AcquireReply::Held {
                lease_left: Some(Duration::from_millis(80)),
                arrival: 0,
                handing_over: true,
                heads_list: false
            }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[0, 5, 1_700_000_000_000_000])).unwrap(),
            AcquireReply::Held {
                lease_left: Some(Duration::from_millis(5)),
                arrival: 1_700_000_000_000_000,
                handing_over: false,
                heads_list: false
            }
        );
        assert_eq!(
            AcquireReply::from_redis_value(ints(&[0, 5, 1_700_000_000_000_000, 1])).unwrap(),
            AcquireReply::Held {
                lease_left: Some(Duration::from_millis(5)),
                arrival: 1_700_000_000_000_000,
                handing_over: false,
                heads_list: true
            }
        );
        let fair = |head: &str| {
            Value::Array(vec![
                Value::Int(0),
                Value::BulkString(head.as_bytes().to_vec()),
            ])
        };
        assert_eq!(
            FairReply::<ReleaseReply>::from_redis_value(fair("a:1")).unwrap(),
            FairReply {
                reply: ReleaseReply::Released,
                wake: Some("a:1".to_owned()),
                parked_on: ParkedOn::Either
            }
        );
        for (said, parked_on) in [
            (0, ParkedOn::Own),
            (1, ParkedOn::Heads),
            (2, ParkedOn::Either),
        ] {
            let mut told = fair("a:1");
            if let Value::Array(items) = &mut told {
                items.push(Value::Int(said));
            }
            let told = FairReply::<ReleaseReply>::from_redis_value(told).unwrap();
            assert_eq!(told.parked_on, parked_on);
        }
        assert_eq!(
            FairReply::<ReleaseReply>::from_redis_value(fair(""))
                .unwrap()
                .wake,
            None
        );
        assert!(AcquireReply::from_redis_value(ints(&[7])).is_err());
        assert_eq!(
            ManyReply::from_redis_value(ints(&[1, 42, 1, 7, 2])).unwrap(),
            ManyReply::Acquired(vec![(42, 1), (7, 2)])
        );
        assert_eq!(
            ManyReply::from_redis_value(ints(&[0, 2, 900])).unwrap(),
            ManyReply::Held {
                index: 1,
                lease_left: Some(Duration::from_millis(900)),
                handing_over: false
            }
        );
        assert_eq!(
            ManyReply::from_redis_value(ints(&[0, 2, 60, -1])).unwrap(),
            ManyReply::Held {
                index: 1,
                lease_left: Some(Duration::from_millis(60)),
                handing_over: true
            }
        );
        assert_eq!(
            ManyReply::from_redis_value(ints(&[0, 1, -1])).unwrap(),
            ManyReply::Held {
                index: 0,
                lease_left: None,
                handing_over: false
            }
        );
        for bad in [
            &[1][..],
            &[1, 42],
            &[0, 0, 5],
            &[0, 1],
            &[2, 1, 1],
            &[0, 1, 5, 3],
        ] {
            assert!(ManyReply::from_redis_value(ints(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(
            ReleaseReply::from_redis_value(Value::Int(-1)).unwrap(),
            ReleaseReply::NotOwner
        );
        assert_eq!(
            ReleaseReply::from_redis_value(Value::Int(2)).unwrap(),
            ReleaseReply::Inner { depth: 2 }
        );
        assert_eq!(
            HandoffReply::from_redis_value(Value::Int(-1)).unwrap(),
            HandoffReply::to(None)
        );
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        assert_eq!(
            HandoffReply::from_redis_value(Value::Array(vec![bulk("1764"), bulk("a:2")])).unwrap(),
            HandoffReply {
                next_in_line: Some("a:2".to_owned()),
                ..HandoffReply::to(Some(1764))
            }
        );
        assert_eq!(
            HandoffReply::from_redis_value(Value::Array(vec![Value::Int(9), bulk("")])).unwrap(),
            HandoffReply::to(Some(9))
        );
        assert_eq!(
            HandoffReply::from_redis_value(ints(&[0])).unwrap(),
            HandoffReply {
                not_head: true,
                ..HandoffReply::to(None)
            }
        );
        assert_eq!(
            HandoffReply::from_redis_value(ints(&[-1])).unwrap(),
            HandoffReply::to(None)
        );
        assert!(HandoffReply::from_redis_value(ints(&[1, 2, 3])).is_err());
        assert_eq!(
            HolderReply::from_redis_value(Value::Array(vec![])).unwrap(),
            HolderReply(None)
        );
    }
}

//! The hook of `ClientBuilder::tracing`: each event becomes a `tracing`
//! event of target `redbaton`, and each acquisition a span `acquire`.
//!
//! The span is made from the events alone. A wait's `Parked` opens it on
//! the waiting thread (kept in a thread-local list, by name: a thread
//! waits for one thing at a time, a multi-lock for one name at a time);
//! the acquisition's end closes it: `Acquired`, `TimedOut` or
//! `AcquireFailed`, all told on that thread. An acquisition that did not
//! wait has no `Parked`: its end makes the span and closes it at once.
//! The wait's own events are told inside the span.

use std::cell::RefCell;
use std::time::Duration;

use tracing::field::Empty;
use tracing::{event, span, Level, Span};

use super::{how, kind, reason};
use crate::observe::{Event, HoldKind};

/// The spans of the waits this thread is in, with their names.
struct Open {
    name: Box<str>,
    span: Span,
}

/// More open spans than a thread can be waiting in: past this, the oldest
/// is closed (without an outcome), so that a wait whose end was somehow
/// never told cannot grow the list.
const MAX_OPEN: usize = 8;

thread_local! {
    static OPEN: RefCell<Vec<Open>> = const { RefCell::new(Vec::new()) };
}

/// A new acquisition span for `name`, its other fields to be recorded.
fn acquisition(name: &str) -> Span {
    span!(
        target: "redbaton",
        Level::INFO,
        "acquire",
        name,
        kind = Empty,
        outcome = Empty,
        waited_ms = Empty,
        fencing_token = Empty,
        how = Empty
    )
}

/// The span of this thread's wait for `name`, opened now (for a hold of
/// `held`) unless it is open already; `None` for a latch's wait, which is
/// no acquisition.
fn open(name: &str, held: Option<HoldKind>) -> Option<Span> {
    let held = held?;
    if let Some(span) = current(name) {
        return Some(span);
    }
    let span = acquisition(name);
    span.record("kind", kind(held));
    let closed = OPEN
        .try_with(|open| {
            let mut open = open.borrow_mut();
            let oldest = (open.len() >= MAX_OPEN).then(|| open.remove(0));
            open.push(Open {
                name: name.into(),
                span: span.clone(),
            });
            oldest
        })
        .ok()
        .flatten();
    // Closed once the list is no longer borrowed.
    drop(closed);
    Some(span)
}

/// The span of this thread's wait for `name`, if one is open.
fn current(name: &str) -> Option<Span> {
    OPEN.try_with(|open| {
        open.borrow()
            .iter()
            .rev()
            .find(|open| &*open.name == name)
            .map(|open| open.span.clone())
    })
    .ok()
    .flatten()
}

/// The span of this thread's wait for `name`, taken out of the list (it
/// closes when the caller drops it).
fn take(name: &str) -> Option<Span> {
    OPEN.try_with(|open| {
        let mut open = open.borrow_mut();
        let at = open.iter().rposition(|open| &*open.name == name)?;
        Some(open.remove(at).span)
    })
    .ok()
    .flatten()
}

/// Records how the acquisition of `span` ended.
fn end(span: &Span, held: HoldKind, outcome: &'static str, waited: Duration) {
    span.record("kind", kind(held));
    span.record("outcome", outcome);
    span.record("waited_ms", waited.as_secs_f64() * 1e3);
}

/// Runs `tell` inside `span`, if there is one.
fn within(span: Option<&Span>, tell: impl FnOnce()) {
    match span {
        Some(span) => span.in_scope(tell),
        None => tell(),
    }
}

/// The hook.
pub(crate) fn sink(event: &Event<'_>) {
    match *event {
        Event::Acquired {
            name,
            kind: held,
            waited,
            fencing_token,
            how: acquired,
        } => {
            let span = take(name).unwrap_or_else(|| acquisition(name));
            end(&span, held, "acquired", waited);
            span.record("how", how(acquired));
            if let Some(token) = fencing_token {
                span.record("fencing_token", token);
            }
            span.in_scope(|| {
                event!(
                    target: "redbaton",
                    Level::DEBUG,
                    name,
                    kind = kind(held),
                    waited = ?waited,
                    fencing_token,
                    how = how(acquired),
                    "acquired"
                );
            });
        }
        Event::AcquireFailed {
            name,
            kind: held,
            waited,
        } => {
            let span = take(name).unwrap_or_else(|| acquisition(name));
            end(&span, held, "failed", waited);
            span.in_scope(|| {
                event!(
                    target: "redbaton",
                    Level::INFO,
                    name,
                    kind = kind(held),
                    waited = ?waited,
                    "acquisition failed"
                );
            });
        }
        Event::Released {
            name,
            kind: held,
            held: for_how_long,
        } => event!(
            target: "redbaton",
            Level::DEBUG,
            name,
            kind = kind(held),
            held = ?for_how_long,
            "released"
        ),
        Event::Lost {
            name,
            kind: held,
            reason: why,
        } => event!(
            target: "redbaton",
            Level::WARN,
            name,
            kind = kind(held),
            reason = reason(why),
            "lost: {why}"
        ),
        Event::ReleaseFailed {
            name,
            kind: held,
            held: for_how_long,
        } => event!(
            target: "redbaton",
            Level::INFO,
            name,
            kind = kind(held),
            held = ?for_how_long,
            "release failed"
        ),
        Event::RenewalFailed { name, kind: held } => event!(
            target: "redbaton",
            Level::INFO,
            name,
            kind = kind(held),
            "renewal failed; retried until the lease would end"
        ),
        Event::ReleaseRetried { name } => event!(
            target: "redbaton",
            Level::INFO,
            name,
            "release goes on in the background"
        ),
        Event::Parked { name, kind: held } => {
            within(open(name, held).as_ref(), || {
                event!(target: "redbaton", Level::DEBUG, name, "parked");
            });
        }
        Event::Woken { name, waited } => within(current(name).as_ref(), || {
            event!(
                target: "redbaton",
                Level::DEBUG,
                name,
                waited = ?waited,
                "woken"
            );
        }),
        Event::TimedOut { name, waited } => {
            // No span: a latch's wait.
            let span = take(name);
            if let Some(span) = &span {
                span.record("outcome", "timed_out");
                span.record("waited_ms", waited.as_secs_f64() * 1e3);
            }
            within(span.as_ref(), || {
                event!(
                    target: "redbaton",
                    Level::INFO,
                    name,
                    waited = ?waited,
                    "timed out"
                );
            });
        }
        Event::SlotMapReloaded => event!(target: "redbaton", Level::INFO, "slot map reloaded"),
        Event::MasterSwitched { service } => event!(
            target: "redbaton",
            Level::INFO,
            service,
            "master switched"
        ),
        Event::MasterSuspect { master } => event!(
            target: "redbaton",
            Level::INFO,
            master,
            "master suspect: left out of rounds"
        ),
        Event::MasterBack { master } => event!(
            target: "redbaton",
            Level::INFO,
            master,
            "master back"
        ),
    }
}

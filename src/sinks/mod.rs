//! Hooks that tell the client's events to the ecosystem's facades: the
//! `metrics` crate (feature `metrics`) and the `tracing` crate (feature
//! `tracing`). Each is an event hook like any other, added by its
//! `ClientBuilder` method: events are born in one place, the observer.

use crate::observe::{Acquisition, HoldKind, LostReason};

#[cfg(feature = "metrics")]
pub(crate) mod metrics;
#[cfg(feature = "tracing")]
pub(crate) mod tracing;

/// A kind of hold as a label value.
pub(crate) fn kind(kind: HoldKind) -> &'static str {
    match kind {
        HoldKind::Lock => "lock",
        HoldKind::FairLock => "fair_lock",
        HoldKind::Read => "read",
        HoldKind::Write => "write",
        HoldKind::Upgradable => "upgradable",
        HoldKind::Permits => "permits",
    }
}

/// How an acquisition got its hold, as a label value.
pub(crate) fn how(how: Acquisition) -> &'static str {
    match how {
        Acquisition::FirstAttempt => "first_attempt",
        Acquisition::AfterWaiting => "after_waiting",
        Acquisition::LocalHandoff => "local_handoff",
    }
}

/// Why a hold was lost, as a label value.
pub(crate) fn reason(reason: LostReason) -> &'static str {
    match reason {
        LostReason::LeaseEnded => "lease_ended",
        LostReason::Unreachable => "unreachable",
        LostReason::Gone => "gone",
        LostReason::TakenOver => "taken_over",
        LostReason::NotHeld => "not_held",
    }
}

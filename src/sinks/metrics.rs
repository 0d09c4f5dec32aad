//! The hook of `ClientBuilder::metrics`: each event becomes a counter, a
//! histogram or a gauge update of the `metrics` facade.

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Label, Unit,
};

use super::{how, kind, reason};
use crate::observe::{Acquisition, Event, HoldKind};

/// Acquisitions, by `kind` and `how`.
const ACQUISITIONS: &str = "redbaton_acquisitions_total";
/// Acquisitions that were not won by the first attempt, by `kind`.
const CONTENDED: &str = "redbaton_contended_acquisitions_total";
/// Waits whose deadline passed.
const TIMEOUTS: &str = "redbaton_timeouts_total";
/// Acquisitions that gave up on an error, by `kind`.
const ACQUIRE_FAILURES: &str = "redbaton_acquire_failures_total";
/// Holds found lost, by `kind` and `reason`.
const LOSSES: &str = "redbaton_losses_total";
/// Releases that failed on something other than a loss, by `kind`.
const RELEASE_FAILURES: &str = "redbaton_release_failures_total";
/// Renewals that met an unreachable or busy Redis, by `kind`.
const RENEWAL_FAILURES: &str = "redbaton_renewal_failures_total";
/// Releases (or undoings) handed to the background thread.
const BACKGROUND_RELEASES: &str = "redbaton_background_releases_total";
/// A cluster's slot map loads.
const SLOT_MAP_RELOADS: &str = "redbaton_slot_map_reloads_total";
/// New masters reported by the sentinels.
const MASTER_SWITCHES: &str = "redbaton_master_switches_total";
/// Redlock masters left out of rounds.
const SUSPECT_MASTERS: &str = "redbaton_suspect_masters_total";
/// From the call to the hold, by `kind`.
const WAIT: &str = "redbaton_wait_seconds";
/// From the acquisition to the release, by `kind`.
const HOLD: &str = "redbaton_hold_seconds";
/// Threads waiting now.
const PARKED: &str = "redbaton_parked_waiters";
/// Holds held now, by `kind`.
const HELD: &str = "redbaton_held";

/// Describes the metrics to the recorder installed now (the global one,
/// or a thread's local one).
pub(crate) fn describe() {
    let counters = [
        (
            ACQUISITIONS,
            "Acquisitions (guards and permits made), by kind and how",
        ),
        (
            CONTENDED,
            "Acquisitions not won by the first attempt, by kind",
        ),
        (
            TIMEOUTS,
            "Waits that ended at their deadline without the object",
        ),
        (
            ACQUIRE_FAILURES,
            "Acquisitions that gave up on an error, by kind",
        ),
        (LOSSES, "Holds found lost, by kind and reason"),
        (
            RELEASE_FAILURES,
            "Releases that failed on a Redis error, by kind",
        ),
        (
            RENEWAL_FAILURES,
            "Renewals that met an unreachable or busy Redis, by kind",
        ),
        (
            BACKGROUND_RELEASES,
            "Releases sent again by the background thread",
        ),
        (SLOT_MAP_RELOADS, "Loads of a cluster's slot map"),
        (MASTER_SWITCHES, "New masters reported by the sentinels"),
        (SUSPECT_MASTERS, "Redlock masters left out of rounds"),
    ];
    for (metric, description) in counters {
        describe_counter!(metric, Unit::Count, description);
    }
    describe_histogram!(WAIT, Unit::Seconds, "From the call to the hold, by kind");
    describe_histogram!(
        HOLD,
        Unit::Seconds,
        "From the acquisition to the release, by kind"
    );
    describe_gauge!(PARKED, Unit::Count, "Threads waiting for a synchronizer");
    describe_gauge!(HELD, Unit::Count, "Holds of this process, by kind");
}

/// The hook: `names_as_labels` adds the synchronizer's name as label
/// `name`.
pub(crate) fn sink(names_as_labels: bool) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
    move |event| record(event, names_as_labels)
}

/// The labels of an event about `name`, of kind `held` if any, with the
/// event's own `extra` ones.
fn labels(
    named: bool,
    name: &str,
    held: Option<HoldKind>,
    extra: &[(&'static str, &'static str)],
) -> Vec<Label> {
    let mut labels = Vec::with_capacity(2 + extra.len());
    if let Some(held) = held {
        labels.push(Label::from_static_parts("kind", kind(held)));
    }
    labels.extend(
        extra
            .iter()
            .map(|(key, value)| Label::from_static_parts(key, value)),
    );
    if named {
        labels.push(Label::new("name", name.to_owned()));
    }
    labels
}

fn record(event: &Event<'_>, named: bool) {
    match *event {
        Event::Acquired {
            name,
            kind: held,
            waited,
            how: acquired,
            ..
        } => {
            let by_kind = labels(named, name, Some(held), &[]);
            counter!(
                ACQUISITIONS,
                labels(named, name, Some(held), &[("how", how(acquired))])
            )
            .increment(1);
            if acquired != Acquisition::FirstAttempt {
                counter!(CONTENDED, by_kind.clone()).increment(1);
            }
            histogram!(WAIT, by_kind.clone()).record(waited);
            gauge!(HELD, by_kind).increment(1.0);
        }
        Event::Released {
            name,
            kind: held,
            held: for_how_long,
        } => {
            let by_kind = labels(named, name, Some(held), &[]);
            histogram!(HOLD, by_kind.clone()).record(for_how_long);
            gauge!(HELD, by_kind).decrement(1.0);
        }
        // Each hold ends in one of `Released`, `Lost` (its release then
        // fails with `LockLost`, and is told nothing) and `ReleaseFailed`:
        // the gauge counts it down at each.
        Event::Lost {
            name,
            kind: held,
            reason: why,
        } => {
            counter!(
                LOSSES,
                labels(named, name, Some(held), &[("reason", reason(why))])
            )
            .increment(1);
            gauge!(HELD, labels(named, name, Some(held), &[])).decrement(1.0);
        }
        Event::ReleaseFailed {
            name, kind: held, ..
        } => {
            counter!(RELEASE_FAILURES, labels(named, name, Some(held), &[])).increment(1);
            gauge!(HELD, labels(named, name, Some(held), &[])).decrement(1.0);
        }
        Event::RenewalFailed { name, kind: held } => {
            counter!(RENEWAL_FAILURES, labels(named, name, Some(held), &[])).increment(1);
        }
        Event::ReleaseRetried { name } => {
            counter!(BACKGROUND_RELEASES, labels(named, name, None, &[])).increment(1);
        }
        Event::AcquireFailed {
            name, kind: held, ..
        } => {
            counter!(ACQUIRE_FAILURES, labels(named, name, Some(held), &[])).increment(1);
        }
        Event::Parked { name, .. } => {
            gauge!(PARKED, labels(named, name, None, &[])).increment(1.0);
        }
        Event::Woken { name, .. } => {
            gauge!(PARKED, labels(named, name, None, &[])).decrement(1.0);
        }
        Event::TimedOut { name, .. } => {
            counter!(TIMEOUTS, labels(named, name, None, &[])).increment(1);
        }
        Event::SlotMapReloaded => counter!(SLOT_MAP_RELOADS).increment(1),
        Event::MasterSwitched { service } => {
            counter!(MASTER_SWITCHES, "service" => service.to_owned()).increment(1);
        }
        Event::MasterSuspect { master } => {
            counter!(SUSPECT_MASTERS, "master" => master.to_owned()).increment(1);
        }
        Event::MasterBack { .. } => {}
    }
}

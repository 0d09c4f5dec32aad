//! The hook of `ClientBuilder::tracing`: each event becomes a `tracing`
//! event of target `redbaton`.

use tracing::{event, Level};

use super::{how, kind, reason};
use crate::observe::Event;

/// The hook.
pub(crate) fn sink(event: &Event<'_>) {
    match *event {
        Event::Acquired {
            name,
            kind: held,
            waited,
            fencing_token,
            how: acquired,
        } => event!(
            target: "redbaton",
            Level::DEBUG,
            name,
            kind = kind(held),
            waited = ?waited,
            fencing_token,
            how = how(acquired),
            "acquired"
        ),
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
        Event::Parked { name } => event!(target: "redbaton", Level::DEBUG, name, "parked"),
        Event::Woken { name, waited } => event!(
            target: "redbaton",
            Level::DEBUG,
            name,
            waited = ?waited,
            "woken"
        ),
        Event::TimedOut { name, waited } => event!(
            target: "redbaton",
            Level::INFO,
            name,
            waited = ?waited,
            "timed out"
        ),
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

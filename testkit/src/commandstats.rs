//! `INFO commandstats`: calls per command, and what was called between two
//! snapshots, for tests and benches that bound the commands a client sends.

use std::collections::BTreeMap;

/// Parses `INFO commandstats` into command name → calls.
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Per-command call increase from `before` to `after`, minus `info`.
///
/// Saturating because a restart between the snapshots resets the counters.
pub fn diff_calls(
    before: &BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .into_iter()
        .filter(|(name, _)| name != "info")
        .filter_map(|(name, calls)| {
            let new_calls = calls.saturating_sub(before.get(&name).copied().unwrap_or(0));
            (new_calls > 0).then_some((name, new_calls))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_parsed_by_name() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_client|setname:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_broken\r\n";
        let calls = parse_commandstats(info);
        assert_eq!(
            calls,
            BTreeMap::from([("client|setname".to_owned(), 2), ("evalsha".to_owned(), 12)])
        );
    }

    #[test]
    fn diff_skips_info_unchanged_and_reset_counters() {
        let before = BTreeMap::from([
            ("get".to_owned(), 5),
            ("info".to_owned(), 1),
            ("set".to_owned(), 9),
        ]);
        let after = BTreeMap::from([
            ("get".to_owned(), 5),
            ("info".to_owned(), 3),
            ("set".to_owned(), 2),
            ("blpop".to_owned(), 4),
        ]);
        assert_eq!(
            diff_calls(&before, after),
            BTreeMap::from([("blpop".to_owned(), 4)])
        );
    }
}

//! Redis Cluster's key-to-slot rule: CRC16 (XMODEM) of the key's hash tag,
//! modulo 16384. The tag is the part between the first `{` and the next
//! `}` when that part is non-empty, else the whole key.

/// How many slots a cluster has.
pub(super) const SLOTS: usize = 16384;

/// The slot of `key`.
pub(super) fn of(key: &str) -> u16 {
    let key = key.as_bytes();
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    // SLOTS is a power of two, so the mask is the modulo.
    crc16(tagged.unwrap_or(key)) & (SLOTS as u16 - 1)
}

/// Reads a `CLUSTER SLOTS` reply; a master announced without a host (an
/// empty string or `?`) is at `asked_host`.
pub(super) fn parse_map(
    reply: redis::Value,
    asked_host: &str,
) -> Option<Vec<(u16, u16, String, u16)>> {
    let redis::Value::Array(ranges) = reply else {
        return None;
    };
    let int = |value: &redis::Value| match value {
        redis::Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    ranges
        .iter()
        .map(|range| {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let redis::Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let host = if host.is_empty() || host == "?" {
                asked_host.to_owned()
            } else {
                host
            };
            Some((
                int(fields.first()?)?,
                int(fields.get(1)?)?,
                host,
                int(master.get(1)?)?,
            ))
        })
        .collect()
}

/// The slots a node serves and those it is migrating away, from its own
/// `CLUSTER NODES` (the `myself` line: ranges `a-b`, single slots, and
/// `[slot->-target]` for a slot being migrated; `[slot-<-source]`, a slot
/// being imported, is not served yet). `None`: no `myself` line.
pub(super) fn own_slots(nodes: &str) -> Option<OwnSlots> {
    let myself = nodes.lines().find(|line| {
        line.split(' ')
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|flag| flag == "myself"))
    })?;
    let mut served = Vec::new();
    let mut migrating = Vec::new();
    for field in myself.split(' ').skip(8) {
        if let Some(moving) = field.strip_prefix('[') {
            if let Some((slot, _)) = moving.split_once("->-") {
                migrating.push(slot.parse().ok()?);
            }
        } else if let Some((first, last)) = field.split_once('-') {
            served.push((first.parse().ok()?, last.parse().ok()?));
        } else if !field.is_empty() {
            let slot = field.parse().ok()?;
            served.push((slot, slot));
        }
    }
    Some(OwnSlots { served, migrating })
}

/// What a node says of its own slots.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct OwnSlots {
    /// The ranges it serves, first and last slot.
    pub(super) served: Vec<(u16, u16)>,
    /// The slots it is migrating away (and serves still).
    pub(super) migrating: Vec<u16>,
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_line_of_cluster_nodes() {
        let nodes = "07c3 127.0.0.1:30002@40002 master - 0 1 2 connected 5461-10922\n\
                     e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 \
                     10923 [5000->-07c3] [6000-<-07c3]\n";
        assert_eq!(
            own_slots(nodes),
            Some(OwnSlots {
                served: vec![(0, 5460), (10923, 10923)],
                migrating: vec![5000]
            })
        );
        assert_eq!(
            own_slots("e7d1 127.0.0.1:1@2 master - 0 0 1 connected 1-2\n"),
            None
        );
    }

    #[test]
    fn matches_the_cluster_specification() {
        // The check value of CRC-16/XMODEM, and the example slots of the
        // Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(of("123456789"), 0x31C3 & 16383);
        assert_eq!(of("{user1000}.following"), of("user1000"));
        // An empty tag (`{}`) is no tag: the whole key is hashed, not the
        // empty string (slot 0) nor a later tag.
        assert_eq!(of("foo{}{bar}"), crc16(b"foo{}{bar}") & 16383);
        assert_ne!(of("foo{}{bar}"), of("bar"));
        assert_eq!(of("foo{{bar}}zap"), of("{bar"));
        assert_eq!(of("foo{bar}{zap}"), of("bar"));
    }

    #[test]
    fn agrees_with_cluster_keyslot() {
        // What `CLUSTER KEYSLOT` of Redis 7.0 answers for each key.
        for (key, slot) in [
            ("foo{}{bar}", 8363),
            ("{}", 15257),
            ("foo{}", 5542),
            ("{}bar", 6479),
            ("foo{bar}{zap}", 5061),
            ("foo{{bar}}zap", 4015),
        ] {
            assert_eq!(of(key), slot, "{key}");
        }
    }
}

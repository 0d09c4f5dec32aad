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

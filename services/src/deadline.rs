//! The `grpc-timeout` header: read on the way in (by hops and the broker),
//! so the remaining time can be passed on (deadline propagation).

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The call's `grpc-timeout`, if present and well-formed.
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    parse_grpc_timeout(metadata.get("grpc-timeout")?.to_str().ok()?)
}

/// Parses a `grpc-timeout` value ("100m", "250u", "2S"): at most 8 digits
/// and a unit (H, M, S, m, u, n). Anything else is `None`.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("250u"), Some(Duration::from_micros(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "12x", "-1m", "123456789m", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
        let mut md = MetadataMap::new();
        assert_eq!(grpc_timeout(&md), None);
        md.insert("grpc-timeout", "250u".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), Some(Duration::from_micros(250)));
    }
}

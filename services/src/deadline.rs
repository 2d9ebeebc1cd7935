//! The `grpc-timeout` header: read on the way in (by hops and the broker),
//! so the remaining time can be passed on (deadline propagation).

use std::future::Future;
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

/// How much longer a caller waits than the deadline it sends, so the
/// callee's own DEADLINE_EXCEEDED, which says where the time went, arrives
/// before the caller's safety net fires and resets the stream.
pub(crate) const ANSWER_SLACK: Duration = Duration::from_millis(20);

/// Awaits `call`, sent with `deadline`, for at most `deadline` plus
/// [`ANSWER_SLACK`]. A call that outlives that is DEADLINE_EXCEEDED, and so
/// is one the callee cut short once the deadline had passed: tonic's server
/// reports its own `grpc-timeout` expiry as CANCELLED ("Timeout expired").
/// `what` names what was waited for.
pub(crate) async fn within<T>(
    deadline: Duration,
    call: impl Future<Output = Result<T, Status>>,
    what: impl FnOnce() -> String,
) -> Result<T, Status> {
    let sent = tokio::time::Instant::now();
    match tokio::time::timeout(deadline + ANSWER_SLACK, call).await {
        Ok(Err(status)) if status.code() == Code::Cancelled && sent.elapsed() >= deadline => {
            Err(Status::deadline_exceeded(format!(
                "{} within {deadline:?} (the callee's deadline fired: {})",
                what(),
                status.message()
            )))
        }
        Ok(result) => result,
        Err(_) => Err(Status::deadline_exceeded(format!(
            "{} within {deadline:?}",
            what()
        ))),
    }
}

/// The call's `grpc-timeout`, if present and well-formed.
pub(crate) fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
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

    async fn answer_after(delay: Duration, status: Option<Status>) -> Result<(), Status> {
        tokio::time::sleep(delay).await;
        status.map_or(Ok(()), Err)
    }

    #[tokio::test(start_paused = true)]
    async fn a_callee_timeout_after_the_deadline_is_deadline_exceeded() {
        let limit = Duration::from_millis(100);
        let what = || "no answer".to_owned();
        let cancelled = || Some(Status::cancelled("Timeout expired"));
        // The callee's timer fired first, once the deadline had passed.
        // (tokio's timeout polls the call first, so at the same instant the
        // callee's answer wins the race.)
        let late = within(limit, answer_after(limit, cancelled()), what).await;
        let status = late.expect_err("cancelled");
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status.message().contains("callee's deadline fired"),
            "{status:?}"
        );
        // Cancelled early is a real cancellation, kept as it is.
        let early = within(limit, answer_after(limit / 2, cancelled()), what).await;
        assert_eq!(early.map_err(|s| s.code()), Err(Code::Cancelled));
        // No answer at all.
        let silent = within(limit, std::future::pending::<Result<(), Status>>(), what).await;
        let status = silent.expect_err("pending never answers");
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status.message().contains("no answer within 100ms"),
            "{status:?}"
        );
        // In time, untouched; and an answer the callee sends at its
        // deadline still arrives within the slack.
        for delay in [limit / 2, limit + ANSWER_SLACK / 2] {
            assert!(
                within(limit, answer_after(delay, None), what).await.is_ok(),
                "{delay:?}"
            );
        }
    }
}

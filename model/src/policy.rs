//! How a caller reaches one hop, as plain data: a per-attempt timeout,
//! budgeted retries and hedged requests. The services apply it
//! (`tailmesh_services::hop::policy`); the analysis composes its effect on
//! latency.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// When to send a hedge.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hedge {
    /// After a fixed delay without an answer.
    After(Duration),
    /// After this percentile (0-100) of this caller's recent answer times to
    /// the hop; no hedging until enough answers were seen.
    Percentile(f64),
}

/// How a caller reaches one hop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientPolicy {
    /// Time each attempt may take (the overall deadline still applies).
    #[serde(default)]
    pub timeout: Option<Duration>,
    /// Most retries of one call after failed attempts.
    #[serde(default)]
    pub retries: u32,
    /// Retries allowed as a share of calls (0.1: at most about one retry per
    /// ten calls, over time): a budget, so retries cannot multiply load
    /// when the hop is down.
    #[serde(default)]
    pub retry_budget: f64,
    /// Hedged requests.
    #[serde(default)]
    pub hedge: Option<Hedge>,
}

impl ClientPolicy {
    /// Whether the policy changes anything.
    pub fn is_plain(&self) -> bool {
        self.timeout.is_none() && self.retries == 0 && self.hedge.is_none()
    }
}

/// Whether a failed attempt with this gRPC status code (its number) is
/// worth another try: UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED
/// and ABORTED are; the others would fail again.
pub fn retryable_code(code: i32) -> bool {
    // DEADLINE_EXCEEDED 4, RESOURCE_EXHAUSTED 8, ABORTED 10, UNAVAILABLE 14.
    matches!(code, 4 | 8 | 10 | 14)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_codes_are_retryable() {
        let retryable: Vec<i32> = (0..=16).filter(|c| retryable_code(*c)).collect();
        assert_eq!(retryable, vec![4, 8, 10, 14]);
    }
}

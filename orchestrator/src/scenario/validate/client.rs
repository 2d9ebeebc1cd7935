//! A hop's `[hop.client]`: how it calls its downstream hops (timeout,
//! retries and their budget, hedging).

use crate::scenario::error::Problems;
use crate::scenario::model::{ClientPolicy, Hedge};
use crate::scenario::read::Section;

/// `client = { timeout, retries, retry_budget, hedge_after | hedge_percentile }`.
pub(super) fn client_policy(s: &Section<'_>, p: &mut Problems) -> Option<ClientPolicy> {
    s.unknown_keys(
        p,
        &[
            "timeout",
            "retries",
            "retry_budget",
            "hedge_after",
            "hedge_percentile",
        ],
    );
    let timeout = match s.get("timeout") {
        None => Some(None),
        Some(_) => s.positive_duration(p, "timeout").map(Some),
    };
    let retries = match s.get("retries") {
        None => Some(0),
        Some(_) => s
            .int_in(p, "retries", 0, 10)
            .and_then(|r| u32::try_from(r).ok()),
    };
    let retry_budget = match s.get("retry_budget") {
        None => Some(if retries.unwrap_or(0) > 0 { 0.1 } else { 0.0 }),
        Some(_) => s.number_in(p, "retry_budget", 0.0, false, 10.0),
    };
    let hedge = match (s.get("hedge_after"), s.get("hedge_percentile")) {
        (Some(_), Some(_)) => {
            s.forbid(
                p,
                "hedge_percentile",
                "cannot go with hedge_after: choose one",
            );
            None
        }
        (Some(_), None) => s
            .positive_duration(p, "hedge_after")
            .map(|d| Some(Hedge::After(d))),
        (None, Some(_)) => s
            .number_in(p, "hedge_percentile", 0.0, true, 100.0)
            .map(|q| Some(Hedge::Percentile(q))),
        (None, None) => Some(None),
    };
    if let (Some(Some(t)), Some(Some(Hedge::After(h)))) = (timeout, hedge)
        && h >= t
    {
        s.forbid(
            p,
            "hedge_after",
            &format!(
                "({}) must be shorter than the timeout ({}): the hedge would never be sent",
                humantime::format_duration(h),
                humantime::format_duration(t)
            ),
        );
        return None;
    }
    Some(ClientPolicy {
        timeout: timeout?,
        retries: retries?,
        retry_budget: retry_budget?,
        hedge: hedge?,
    })
}

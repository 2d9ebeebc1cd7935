//! Scoring rankings against the cases' labels: AC@k, the share of cases
//! whose root-cause service is among a ranking's first k, and Avg@5, the
//! mean of AC@1 to AC@5, per fault kind and over all (RCAEval's
//! measures). A case a method gave no ranking for counts as a miss, and
//! is counted. Pure: no I/O.

use serde::Serialize;

use super::draw::Kind;

/// One method's scores.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MethodScore {
    pub method: String,
    /// Per fault kind present, in [`Kind::ALL`]'s order, then `all`.
    pub kinds: Vec<KindScore>,
}

/// Scores over a set of cases.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KindScore {
    /// The fault kind, or `all`.
    pub kind: String,
    pub cases: u64,
    /// Cases without a ranking from this method.
    pub unranked: u64,
    pub ac1: f64,
    pub ac3: f64,
    pub avg5: f64,
}

/// Where the root cause came in a ranking: 0 first; `None` when absent
/// or when there is no ranking.
pub fn position(ranking: Option<&[String]>, service: &str) -> Option<usize> {
    ranking?.iter().position(|s| s == service)
}

/// Scores one method from each case's kind and where its root cause
/// came (`None`: missed or unranked, `ranked` false: unranked).
pub fn score(method: &str, cases: &[(Kind, Option<usize>, bool)]) -> MethodScore {
    let group = |kind: Option<Kind>| -> Vec<(Option<usize>, bool)> {
        cases
            .iter()
            .filter(|(k, _, _)| kind.is_none_or(|kind| *k == kind))
            .map(|&(_, at, ranked)| (at, ranked))
            .collect()
    };
    let kinds = Kind::ALL
        .into_iter()
        .map(Some)
        .chain([None])
        .filter_map(|kind| {
            let results = group(kind);
            if results.is_empty() {
                return None;
            }
            let n = results.len() as f64;
            let ac = |k: usize| {
                results
                    .iter()
                    .filter(|(at, _)| at.is_some_and(|p| p < k))
                    .count() as f64
                    / n
            };
            Some(KindScore {
                kind: kind.map_or("all", Kind::as_str).to_owned(),
                cases: results.len() as u64,
                unranked: results.iter().filter(|(_, ranked)| !ranked).count() as u64,
                ac1: ac(1),
                ac3: ac(3),
                avg5: (1..=5).map(ac).sum::<f64>() / 5.0,
            })
        })
        .collect();
    MethodScore {
        method: method.to_owned(),
        kinds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ac_at_k_and_avg_at_5_count_where_the_root_cause_came() {
        let names = ["b", "a", "c"].map(String::from);
        assert_eq!(position(Some(&names), "a"), Some(1));
        assert_eq!(position(Some(&names), "x"), None);
        assert_eq!(position(None, "a"), None);
        let s = score(
            "m",
            &[
                (Kind::Slow, Some(0), true),
                (Kind::Slow, Some(3), true),
                (Kind::Error, None, false),
                (Kind::Error, Some(1), true),
            ],
        );
        let kinds: Vec<&str> = s.kinds.iter().map(|k| k.kind.as_str()).collect();
        assert_eq!(kinds, ["slow", "error", "all"]);
        let slow = &s.kinds[0];
        assert_eq!(slow.cases, 2);
        assert_eq!(slow.ac1, 0.5);
        assert_eq!(slow.ac3, 0.5);
        // AC@1..5 = 0.5, 0.5, 0.5, 1, 1.
        assert!((slow.avg5 - 0.7).abs() < 1e-12);
        let error = &s.kinds[1];
        assert_eq!((error.unranked, error.ac1, error.ac3), (1, 0.0, 0.5));
        let all = &s.kinds[2];
        assert_eq!(all.cases, 4);
        assert_eq!(all.ac1, 0.25);
        assert_eq!(all.ac3, 0.5);
    }
}

//! Client policies a caller applies when it reaches a hop: a per-attempt
//! timeout, retries limited by a budget, and hedged requests (Dean and
//! Barroso, "The Tail at Scale": send a second copy when the first is
//! slower than usual, take whichever answers first, cancel the other).
//!
//! Every attempt carries its number (`CallRequest.attempt`), and a hop's
//! random draws are keyed on it, so a hedge or a retry meets the callee's
//! fault schedule afresh, as a real second try would.

use std::{
    future::Future,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use hdrhistogram::Histogram;
use tailmesh_proto::pb::{AttemptEnd, AttemptTiming};
use tailmesh_units::nanos;
use tokio::time::Instant;
use tonic::{Code, Status};

pub use tailmesh_model::policy::{ClientPolicy, Hedge};

/// Answers seen before a percentile hedge starts.
const WARM_SAMPLES: u64 = 100;
/// How often (in answers) the percentile is recomputed.
const REFRESH_EVERY: u64 = 64;
/// Most retry tokens a caller saves up.
const MAX_TOKENS: f64 = 10.0;

/// What a caller remembers about a hop between calls.
pub struct PolicyState {
    tokens: Mutex<f64>,
    answers: Mutex<Histogram<u64>>,
    seen: AtomicU64,
    /// The current percentile hedge delay in µs (0: not yet known).
    hedge_us: AtomicU64,
}

impl Default for PolicyState {
    fn default() -> Self {
        PolicyState {
            tokens: Mutex::new(0.0),
            answers: Mutex::new(new_histogram()),
            seen: AtomicU64::new(0),
            hedge_us: AtomicU64::new(0),
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 us to 1 hour at 2 significant digits: small and cheap to query.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("constant, valid histogram bounds")
}

/// How a call went: its result, how many attempts beyond the first it
/// took (retries and hedges: the extra load the policy cost), and each
/// attempt's timing.
#[derive(Debug)]
pub struct Called<T> {
    /// The first successful answer, or the last error.
    pub result: Result<T, Status>,
    /// Attempts beyond the first.
    pub extra_attempts: u32,
    /// Every attempt in the order sent: when it went (after the call's
    /// start), how long it ran and how it ended. Attempts still running
    /// when another answered are cancelled, their time censored there.
    pub attempts: Vec<AttemptTiming>,
}

impl PolicyState {
    fn hedge_delay(&self, hedge: Hedge) -> Option<Duration> {
        match hedge {
            Hedge::After(d) => Some(d),
            Hedge::Percentile(_) => match self.hedge_us.load(Ordering::Relaxed) {
                0 => None,
                us => Some(Duration::from_micros(us)),
            },
        }
    }

    fn record(&self, policy: &ClientPolicy, took: Duration) {
        let Some(Hedge::Percentile(p)) = policy.hedge else {
            return;
        };
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let high = answers.high();
        let _ = answers.record(us.min(high));
        let seen = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if seen >= WARM_SAMPLES && seen.is_multiple_of(REFRESH_EVERY) {
            let at = answers.value_at_quantile((p / 100.0).clamp(0.0, 1.0));
            self.hedge_us.store(at.max(1), Ordering::Relaxed);
        }
    }

    /// Earns this call's share of retries; spends one if a retry may go.
    fn earn(&self, policy: &ClientPolicy) {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        *t = (*t + policy.retry_budget).min(MAX_TOKENS);
    }

    fn spend(&self) -> bool {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if *t >= 1.0 {
            *t -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Whether a failed attempt is worth another try (the rule is
/// [`tailmesh_model::policy::retryable_code`]'s, shared with the analysis).
pub fn retryable(code: Code) -> bool {
    tailmesh_model::policy::retryable_code(code as i32)
}

/// Calls through `policy`. `attempt(n, timeout)` starts attempt `n`
/// (0 first) with the time it may take; `deadline` is what remains of the
/// caller's own deadline. With a plain policy this is one attempt.
pub async fn call<T, F, Fut>(
    policy: &ClientPolicy,
    state: &PolicyState,
    deadline: Option<Duration>,
    mut attempt: F,
) -> Called<T>
where
    F: FnMut(u32, Option<Duration>) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let started = Instant::now();
    let ends = deadline.map(|d| started + d);
    let budget_for = |now: Instant| {
        let left = ends.map(|e| e.saturating_duration_since(now));
        match (left, policy.timeout) {
            (Some(l), Some(t)) => Some(l.min(t)),
            (l, t) => l.or(t),
        }
    };
    if policy.is_plain() {
        let result = attempt(0, deadline).await;
        let attempts = vec![AttemptTiming {
            start_ns: 0,
            took_ns: nanos(started.elapsed()),
            end: ended(&result) as i32,
        }];
        return Called {
            result,
            extra_attempts: 0,
            attempts,
        };
    }
    state.earn(policy);

    let mut retries_left = policy.retries;
    let mut hedged = false;
    let mut last_error = Status::unavailable("no attempt was made");
    let mut running = FuturesUnordered::new();
    // Each attempt's send time, beside its timing (index = attempt number).
    let mut sent: Vec<Instant> = Vec::new();
    let mut attempts: Vec<AttemptTiming> = Vec::new();
    let launch = |running: &mut FuturesUnordered<_>,
                  attempt: &mut F,
                  sent: &mut Vec<Instant>,
                  attempts: &mut Vec<AttemptTiming>| {
        let n = u32::try_from(sent.len()).unwrap_or(u32::MAX);
        let t0 = Instant::now();
        sent.push(t0);
        attempts.push(AttemptTiming {
            start_ns: nanos(t0.saturating_duration_since(started)),
            took_ns: 0,
            end: AttemptEnd::Unspecified as i32,
        });
        let fut = attempt(n, budget_for(t0));
        running.push(async move { (n, fut.await, t0.elapsed()) });
    };
    launch(&mut running, &mut attempt, &mut sent, &mut attempts);
    loop {
        let hedge_at = match (policy.hedge, hedged) {
            (Some(h), false) => state.hedge_delay(h).map(|d| started + d),
            _ => None,
        };
        let hedge_timer = async {
            match hedge_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            done = running.next() => {
                let Some((n, result, took)) = done else {
                    break;
                };
                if let Some(a) = attempts.get_mut(n as usize) {
                    a.took_ns = nanos(took);
                    a.end = ended(&result) as i32;
                }
                match result {
                    Ok(answer) => {
                        state.record(policy, took);
                        // Dropping the others cancels them (tonic resets
                        // their streams).
                        drop(running);
                        let attempts = cancel_the_rest(attempts, &sent);
                        let extra_attempts = extra(&attempts);
                        return Called { result: Ok(answer), extra_attempts, attempts };
                    }
                    Err(status) => {
                        let again = running.is_empty()
                            && retryable(status.code())
                            && retries_left > 0
                            && budget_for(Instant::now()).is_none_or(|b| !b.is_zero())
                            && state.spend();
                        last_error = status;
                        if again {
                            retries_left -= 1;
                            launch(&mut running, &mut attempt, &mut sent, &mut attempts);
                        }
                    }
                }
            }
            () = hedge_timer => {
                hedged = true;
                launch(&mut running, &mut attempt, &mut sent, &mut attempts);
            }
        }
    }
    drop(running);
    let attempts = cancel_the_rest(attempts, &sent);
    Called {
        result: Err(last_error),
        extra_attempts: extra(&attempts),
        attempts,
    }
}

/// How an attempt that finished ended.
fn ended<T>(result: &Result<T, Status>) -> AttemptEnd {
    match result {
        Ok(_) => AttemptEnd::Ok,
        Err(_) => AttemptEnd::Failed,
    }
}

/// Marks the attempts that had not ended as cancelled now, each censored
/// at the time it ran (`sent[i]`: attempt `i`'s send time).
fn cancel_the_rest(mut attempts: Vec<AttemptTiming>, sent: &[Instant]) -> Vec<AttemptTiming> {
    for (a, t0) in attempts.iter_mut().zip(sent) {
        if a.end() == AttemptEnd::Unspecified {
            a.took_ns = nanos(t0.elapsed());
            a.end = AttemptEnd::Cancelled as i32;
        }
    }
    attempts
}

/// Attempts beyond the first.
fn extra(attempts: &[AttemptTiming]) -> u32 {
    u32::try_from(attempts.len().saturating_sub(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex as StdMutex};

    use super::*;

    type Attempt = std::pin::Pin<Box<dyn Future<Output = Result<u32, Status>> + Send>>;

    /// Attempt `n` answers after `delays[n]` with `results[n]`.
    fn scripted(
        script: Vec<(u64, Result<u32, Code>)>,
        log: Arc<StdMutex<Vec<u32>>>,
    ) -> impl FnMut(u32, Option<Duration>) -> Attempt {
        move |n, _timeout| {
            log.lock().unwrap_or_else(|e| e.into_inner()).push(n);
            let (ms, result) = script
                .get(n as usize)
                .cloned()
                .unwrap_or((0, Err(Code::Internal)));
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                result.map_err(|c| Status::new(c, "scripted"))
            })
        }
    }

    const MS: u64 = 1_000_000;

    /// Each attempt's (start, took, end), in ms on the paused clock.
    fn timings(attempts: &[AttemptTiming]) -> Vec<(u64, u64, AttemptEnd)> {
        attempts
            .iter()
            .map(|a| (a.start_ns / MS, a.took_ns / MS, a.end()))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_policy_makes_one_attempt() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let called = call(
            &ClientPolicy::default(),
            &PolicyState::default(),
            None,
            scripted(vec![(5, Err(Code::Unavailable))], log.clone()),
        )
        .await;
        assert_eq!(called.result.map_err(|s| s.code()), Err(Code::Unavailable));
        assert_eq!(
            (
                called.extra_attempts,
                log.lock().map(|l| l.clone()).unwrap_or_default()
            ),
            (0, vec![0])
        );
        assert_eq!(timings(&called.attempts), [(0, 5, AttemptEnd::Failed)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_after_a_delay_wins_when_the_first_is_slow() {
        let policy = ClientPolicy {
            hedge: Some(Hedge::After(Duration::from_millis(10))),
            ..Default::default()
        };
        let log = Arc::new(StdMutex::new(Vec::new()));
        let start = Instant::now();
        let called = call(
            &policy,
            &PolicyState::default(),
            None,
            scripted(vec![(100, Ok(0)), (5, Ok(1))], log.clone()),
        )
        .await;
        assert_eq!(called.result.ok(), Some(1), "the hedge answered first");
        assert_eq!(called.extra_attempts, 1);
        assert_eq!(start.elapsed(), Duration::from_millis(15));
        // The first ran until the hedge answered, and was cancelled then;
        // the hedge went after the hedge delay.
        assert_eq!(
            timings(&called.attempts),
            [(0, 15, AttemptEnd::Cancelled), (10, 5, AttemptEnd::Ok)]
        );
        assert_eq!(called.attempts[1].start_ns, 10 * MS);
        // A fast first answer sends no hedge.
        let log = Arc::new(StdMutex::new(Vec::new()));
        let called = call(
            &policy,
            &PolicyState::default(),
            None,
            scripted(vec![(3, Ok(0))], log.clone()),
        )
        .await;
        assert_eq!((called.result.ok(), called.extra_attempts), (Some(0), 0));
        assert_eq!(timings(&called.attempts), [(0, 3, AttemptEnd::Ok)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_that_fails_leaves_the_first_to_answer() {
        let policy = ClientPolicy {
            hedge: Some(Hedge::After(Duration::from_millis(10))),
            ..Default::default()
        };
        let log = Arc::new(StdMutex::new(Vec::new()));
        let called = call(
            &policy,
            &PolicyState::default(),
            None,
            scripted(vec![(30, Ok(0)), (5, Err(Code::Unavailable))], log),
        )
        .await;
        assert_eq!(called.result.ok(), Some(0));
        assert_eq!(
            timings(&called.attempts),
            [(0, 30, AttemptEnd::Ok), (10, 5, AttemptEnd::Failed)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_follow_the_budget() {
        let policy = ClientPolicy {
            retries: 3,
            retry_budget: 1.0,
            ..Default::default()
        };
        let log = Arc::new(StdMutex::new(Vec::new()));
        let state = PolicyState::default();
        let script = vec![
            (1, Err(Code::Unavailable)),
            (1, Err(Code::Unavailable)),
            (1, Ok(7)),
        ];
        let called = call(&policy, &state, None, scripted(script, log.clone())).await;
        // One call earned one token: one retry, then the budget is spent.
        assert_eq!(timings(&called.attempts).len(), 2);
        assert_eq!(called.result.map_err(|s| s.code()), Err(Code::Unavailable));
        assert_eq!(called.extra_attempts, 1);
        // A non-retryable error is not retried at all.
        let rich = PolicyState::default();
        *rich.tokens.lock().unwrap_or_else(|e| e.into_inner()) = 5.0;
        let called = call(
            &policy,
            &rich,
            None,
            scripted(vec![(1, Err(Code::InvalidArgument))], log.clone()),
        )
        .await;
        assert_eq!(
            (called.result.map_err(|s| s.code()), called.extra_attempts),
            (Err(Code::InvalidArgument), 0)
        );
        // With tokens, up to `retries` retries until an answer.
        let script = vec![
            (1, Err(Code::Unavailable)),
            (1, Err(Code::Unavailable)),
            (1, Ok(7)),
        ];
        let called = call(&policy, &rich, None, scripted(script, log)).await;
        assert_eq!((called.result.ok(), called.extra_attempts), (Some(7), 2));
        // Each retry went when the attempt before it failed.
        assert_eq!(
            timings(&called.attempts),
            [
                (0, 1, AttemptEnd::Failed),
                (1, 1, AttemptEnd::Failed),
                (2, 1, AttemptEnd::Ok)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_percentile_hedge_waits_for_enough_answers_then_uses_the_percentile() {
        let policy = ClientPolicy {
            hedge: Some(Hedge::Percentile(85.0)),
            ..Default::default()
        };
        let state = PolicyState::default();
        let log = Arc::new(StdMutex::new(Vec::new()));
        assert!(state.hedge_delay(Hedge::Percentile(85.0)).is_none());
        for i in 0..WARM_SAMPLES + REFRESH_EVERY {
            let ms = if i % 10 == 0 { 50 } else { 2 };
            let called = call(
                &policy,
                &state,
                None,
                scripted(vec![(ms, Ok(0))], log.clone()),
            )
            .await;
            assert!(called.result.is_ok());
        }
        let delay = state
            .hedge_delay(Hedge::Percentile(85.0))
            .expect("known by now");
        assert!(
            delay >= Duration::from_millis(2) && delay < Duration::from_millis(50),
            "{delay:?}"
        );
    }
}

//! The hop's downstream calls ([`FanOutLayer`]): once its own work (and
//! injected slowness) is done, its calls ([`Calls`]) stage after stage,
//! each stage's calls side by side, each through its call stack within
//! what is left of the deadline. Which calls a request makes, and how many
//! times, is drawn per request (keyed on the scenario seed, the hop, the
//! request and its branch), so the same seed sends every request down the
//! same path in every variant. The calls' records join the path in the
//! order the calls were made, their timings the hop's calls. The first
//! failed call fails the request; later stages are not called.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use rand::Rng;
use tailmesh_model::calls::{Call, Calls, Repeats};
use tailmesh_proto::pb::{CallRequest, CallTiming};
use tailmesh_units::nanos;
use tokio::time::Instant;
use tonic::Status;
use tower::{Layer, Service};

use super::{HopRequest, Served};
use crate::hop::draw::keyed_rng;
use crate::hop::policy::Called;
use crate::hop::{call::CallStack, stream::Streams};

/// A downstream hop: its name, and the call stack that reaches it.
pub struct Downstream {
    pub hop: Arc<str>,
    pub stack: CallStack,
    /// Whether it is reached by stream: the messages of a stream this hop
    /// serves go to it on a stream of their own (a request that is not on
    /// a stream still calls it).
    pub streaming: bool,
}

/// One call of a stage: which downstream hop, and how it is made.
struct Staged {
    to: usize,
    call: Call,
}

/// Calls hop `caller`'s downstream hops after its own work.
#[derive(Clone)]
pub struct FanOutLayer {
    caller: Arc<str>,
    downstream: Arc<[Downstream]>,
    stages: Arc<[Vec<Staged>]>,
    seed: u64,
    /// The draw stream of the calls, `calls/<caller>`.
    stream: Arc<str>,
}

impl FanOutLayer {
    /// Hop `caller`'s calls of `downstream` by `calls` (empty: every
    /// downstream hop once, side by side), drawn from `seed`. A call of a
    /// hop not in `downstream` is dropped (the scenario's checks keep them
    /// in step).
    pub fn new(caller: &str, downstream: Arc<[Downstream]>, calls: &Calls, seed: u64) -> Self {
        let calls = if calls.is_empty() {
            Calls::all_once(downstream.iter().map(|d| d.hop.to_string()))
        } else {
            calls.clone()
        };
        let stages: Vec<Vec<Staged>> = calls
            .stages
            .into_iter()
            .map(|stage| {
                stage
                    .into_iter()
                    .filter_map(|call| {
                        let to = downstream.iter().position(|d| *d.hop == *call.hop)?;
                        Some(Staged { to, call })
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|s| !s.is_empty())
            .collect();
        FanOutLayer {
            stream: Arc::from(format!("calls/{caller}")),
            caller: Arc::from(caller),
            downstream,
            stages: stages.into(),
            seed,
        }
    }
}

impl<S> Layer<S> for FanOutLayer {
    type Service = FanOut<S>;

    fn layer(&self, inner: S) -> FanOut<S> {
        FanOut {
            inner,
            layer: self.clone(),
        }
    }
}

/// `S`, then the downstream calls (see [`FanOutLayer`]).
#[derive(Clone)]
pub struct FanOut<S> {
    inner: S,
    layer: FanOutLayer,
}

/// The branch of the `occurrence`-th visit (0 for the first) this
/// invocation makes to downstream hop `to`, under its own `branch`: the
/// first visit down first visits keeps 0 (so a mesh without repeated
/// calls draws as it always did); any other a hash of the way there.
pub fn child_branch(branch: u64, to: usize, occurrence: u32) -> u64 {
    if branch == 0 && occurrence == 0 {
        return 0;
    }
    let mut z = branch ^ ((to as u64) << 32 | u64::from(occurrence)) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// The calls one request makes in one stage: per call, the visits in the
/// order made, each with its branch.
fn planned(
    stage: &[Staged],
    draws: &mut impl Iterator<Item = u32>,
    branch: u64,
    seen: &mut [u32],
) -> Vec<(usize, Repeats, Vec<u64>)> {
    let mut out = Vec::with_capacity(stage.len());
    for s in stage {
        let n = draws.next().unwrap_or(0);
        let branches = (0..n)
            .map(|_| {
                let b = child_branch(branch, s.to, seen[s.to]);
                seen[s.to] += 1;
                b
            })
            .collect::<Vec<_>>();
        if !branches.is_empty() {
            out.push((s.to, s.call.repeats, branches));
        }
    }
    out
}

impl<S> Service<HopRequest<Bytes>> for FanOut<S>
where
    S: Service<HopRequest<Bytes>, Response = Served<Bytes>, Error = Status>,
    S::Future: Send + 'static,
{
    type Response = Served<Bytes>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Served<Bytes>, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HopRequest<Bytes>) -> Self::Future {
        let (request_id, deadline) = (request.request_id, request.deadline);
        let (branch, attempt) = (request.branch, request.attempt);
        let stream = request.stream.clone();
        let layer = self.layer.clone();
        let own = self.inner.call(request);
        Box::pin(async move {
            let mut served = own.await?;
            if layer.stages.is_empty() {
                return Ok(served);
            }
            // Every call's two draws, made in a fixed order whatever is
            // called, so one call's probability does not move another's.
            let mut rng = keyed_rng(layer.seed, &layer.stream, request_id ^ branch, attempt);
            let counts: Vec<u32> = layer
                .stages
                .iter()
                .flatten()
                .map(|s| {
                    let (made, which): (f64, f64) = (rng.random(), rng.random());
                    s.call.count_for(made, which)
                })
                .collect();
            let mut counts = counts.into_iter();
            let mut seen = vec![0u32; layer.downstream.len()];
            let child = CallRequest {
                request_id,
                payload: served.reply.clone(),
                attempt: 0,
                caller: layer.caller.to_string(),
                // Followers downstream slow it more often when this hop did.
                caller_slow: served.slow,
                ..Default::default()
            };
            let started = Instant::now();
            for stage in layer.stages.iter() {
                let visits = planned(stage, &mut counts, branch, &mut seen);
                if visits.is_empty() {
                    continue;
                }
                let replies: Vec<Vec<Visit>> =
                    futures::future::join_all(visits.iter().map(|(to, repeats, branches)| {
                        let d = &layer.downstream[*to];
                        let child = &child;
                        let stream = stream.as_ref().filter(|_| d.streaming);
                        async move {
                            match repeats {
                                Repeats::Parallel => {
                                    futures::future::join_all(
                                        branches
                                            .iter()
                                            .map(|b| visit(d, child, *b, deadline, stream)),
                                    )
                                    .await
                                }
                                // One after another: a failed one ends them.
                                Repeats::Sequential => {
                                    let mut out = Vec::with_capacity(branches.len());
                                    for b in branches {
                                        let v = visit(d, child, *b, deadline, stream).await;
                                        let failed = v.1.result.is_err();
                                        out.push(v);
                                        if failed {
                                            break;
                                        }
                                    }
                                    out
                                }
                            }
                        }
                    }))
                    .await;
                for (hop, reply, took) in replies.into_iter().flatten() {
                    served.extra_attempts += reply.extra_attempts;
                    served.calls.push(CallTiming {
                        hop: hop.to_string(),
                        call_ns: nanos(took),
                        attempts: reply.attempts,
                    });
                    match reply.result {
                        Ok(answer) => served.path.extend(answer.path),
                        Err(status) => {
                            served.downstream = started.elapsed();
                            return Err(status);
                        }
                    }
                }
            }
            served.downstream = started.elapsed();
            Ok(served)
        })
    }
}

/// One visit's hop, result and time.
type Visit = (Arc<str>, Called<tailmesh_proto::pb::CallReply>, Duration);

/// One call of `d` on branch `branch`, within what is left of `deadline`
/// when it starts (a spent one is refused by the stack); a message on
/// `stream` when given.
async fn visit(
    d: &Downstream,
    child: &CallRequest,
    branch: u64,
    deadline: Option<Instant>,
    stream: Option<&Streams>,
) -> Visit {
    let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let request = CallRequest {
        branch,
        ..child.clone()
    };
    let t0 = Instant::now();
    let called = d.stack.call_on(request, remaining, stream.cloned()).await;
    (Arc::clone(&d.hop), called, t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_visit_down_first_visits_keeps_branch_zero_and_others_differ() {
        assert_eq!(child_branch(0, 3, 0), 0);
        let others = [
            child_branch(0, 3, 1),
            child_branch(0, 4, 1),
            child_branch(7, 3, 0),
            child_branch(7, 3, 1),
        ];
        assert!(others.iter().all(|b| *b != 0));
        for (i, a) in others.iter().enumerate() {
            assert!(others[i + 1..].iter().all(|b| b != a), "{others:?}");
        }
    }
}

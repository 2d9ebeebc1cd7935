//! The client call stack: how a caller (a hop calling its downstream
//! hops, or the load generator calling the first) reaches a hop, as tower
//! layers around one [`Reach`] service, composed once in
//! `CallStack::build`.
//!
//! From the outside in, for one call:
//!
//! - [`deadline`]: a call with nothing left of the caller's deadline is
//!   refused at once (`DeadlineLayer`);
//! - [`span`]: the caller's client span, whose context every attempt
//!   carries to the callee (`SpanLayer`);
//! - [`policy`]: per-attempt timeouts, budgeted retries and hedges, each
//!   attempt numbered (`PolicyLayer`, over [`crate::hop::policy`]);
//! - [`reach`]: one attempt, by push (the pool's balancing and ejection),
//!   pull (the broker topic) or a direct service call (`Reach`).
//!
//! A layer's service is a cheap clone (its state is shared behind `Arc`s),
//! as tower's services take `&mut self`: every call runs on its own clone,
//! and the policy clones the reach for each attempt, since a hedge runs
//! beside the attempt it hedges (which is also why tower's own `Retry`
//! and `Hedge`, built for other accounting, are not used).

pub mod deadline;
pub mod policy;
pub mod reach;
pub mod span;

use std::time::Duration;

pub use deadline::DeadlineLayer;
pub use policy::PolicyLayer;
pub use reach::Reach;
pub use span::SpanLayer;
use tailmesh_proto::pb::{CallReply, CallRequest};
use tower::{
    ServiceBuilder, ServiceExt,
    layer::util::{Identity, Stack},
    util::Either,
};

use super::{
    policy::{Called, ClientPolicy},
    stream::Streams,
};

/// One call through the stack: the request (its `attempt` is set by the
/// policy layer) and the time it may take, what remains of the caller's
/// deadline (`None`: no deadline).
#[derive(Clone, Debug)]
pub struct Call {
    pub request: CallRequest,
    pub timeout: Option<Duration>,
    /// The caller's streams, when the hop is reached by stream (see
    /// [`super::stream`]): the call is a message on the caller's stream to
    /// the hop. `None`: a unary call.
    pub stream: Option<Streams>,
}

/// The layers of [`layers`], outermost first.
type Layers = Stack<
    PolicyLayer,
    Stack<Either<SpanLayer, Identity>, Stack<Either<DeadlineLayer, Identity>, Identity>>,
>;

/// The one composition of the stack, over any reach (tests put a fake
/// one below); the layers run top to bottom.
fn layers(
    deadline: Option<DeadlineLayer>,
    span: Option<SpanLayer>,
    policy: PolicyLayer,
) -> ServiceBuilder<Layers> {
    ServiceBuilder::new()
        // A spent deadline is refused before it costs a span or a call.
        .option_layer(deadline)
        // One span per call around all its attempts, which carry its context.
        .option_layer(span)
        // Retries and hedges re-enter the reach below, each attempt numbered.
        .layer(policy)
}

/// The stack's service: deadline and span optional (see
/// [`CallStack::build`]), then the policy over the reach.
type Service = Either<deadline::Deadline<Spanned>, Spanned>;
type Spanned = Either<span::ClientSpan<policy::Policy<Reach>>, policy::Policy<Reach>>;

/// A caller's way to one hop: the layers over its reach, built once and
/// shared by every call (`call` takes `&self`).
#[derive(Clone)]
pub struct CallStack {
    service: Service,
    reach: Reach,
}

impl CallStack {
    /// How hop `caller` calls a downstream hop: the whole stack.
    pub fn for_hop(caller: &str, hop: &str, reach: Reach, policy: ClientPolicy) -> Self {
        let span = SpanLayer::new(caller, hop, reach.transport());
        Self::build(reach, policy, Some(DeadlineLayer::new(caller)), Some(span))
    }

    /// How the load generator calls the first hop: no deadline layer (each
    /// request gets the scenario's whole timeout, never a spent one) and
    /// no client span (the generator's spans are its own, made apart from
    /// the call with the times it measures).
    pub fn for_load(reach: Reach, policy: ClientPolicy) -> Self {
        Self::build(reach, policy, None, None)
    }

    fn build(
        reach: Reach,
        policy: ClientPolicy,
        deadline: Option<DeadlineLayer>,
        span: Option<SpanLayer>,
    ) -> Self {
        let service = layers(deadline, span, PolicyLayer::new(policy)).service(reach.clone());
        CallStack { service, reach }
    }

    /// Calls the hop with `request` within `timeout`: the answer or the
    /// last error, and the attempts it took.
    pub async fn call(&self, request: CallRequest, timeout: Option<Duration>) -> Called<CallReply> {
        self.call_on(request, timeout, None).await
    }

    /// [`CallStack::call`], as a message on the caller's stream to the hop
    /// when `stream` is given.
    pub async fn call_on(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
        stream: Option<Streams>,
    ) -> Called<CallReply> {
        let Ok(called) = self
            .service
            .clone()
            .oneshot(Call {
                request,
                timeout,
                stream,
            })
            .await;
        called
    }

    /// The reach at the bottom, for its connections' and endpoints' state.
    pub fn reach(&self) -> &Reach {
        &self.reach
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        task::{Context, Poll},
    };

    use futures::future::BoxFuture;
    use tokio::time::Instant;
    use tonic::{Code, Status};
    use tower::Service;

    use super::*;
    use crate::{hop::policy::Hedge, model::Transport};

    /// A reach whose attempt `n` answers after `script[n].0` ms with
    /// `script[n].1` (later attempts fail INTERNAL), and which remembers
    /// each attempt's number and timeout.
    #[derive(Clone, Default)]
    struct FakeReach {
        script: Arc<Vec<(u64, Result<(), Code>)>>,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    /// An attempt's number and timeout, as the reach saw them.
    type Seen = (u32, Option<Duration>);

    impl FakeReach {
        fn new(script: Vec<(u64, Result<(), Code>)>) -> Self {
            FakeReach {
                script: Arc::new(script),
                seen: Arc::default(),
            }
        }

        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().map(|s| s.clone()).unwrap_or_default()
        }
    }

    impl Service<Call> for FakeReach {
        type Response = CallReply;
        type Error = Status;
        type Future = BoxFuture<'static, Result<CallReply, Status>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, call: Call) -> Self::Future {
            let attempt = call.request.attempt;
            if let Ok(mut seen) = self.seen.lock() {
                seen.push((attempt, call.timeout));
            }
            let (ms, result) = self
                .script
                .get(attempt as usize)
                .cloned()
                .unwrap_or((0, Err(Code::Internal)));
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                result
                    .map(|()| CallReply {
                        request_id: u64::from(attempt),
                        ..CallReply::default()
                    })
                    .map_err(|code| Status::new(code, "scripted"))
            })
        }
    }

    /// The hop's whole stack (deadline, span, policy) over `reach`.
    async fn call_as_hop(
        reach: &FakeReach,
        policy: &PolicyLayer,
        timeout: Option<Duration>,
    ) -> Called<CallReply> {
        let stack = layers(
            Some(DeadlineLayer::new("a")),
            Some(SpanLayer::new("a", "b", Some(Transport::Push))),
            policy.clone(),
        )
        .service(reach.clone());
        let Ok(called) = stack
            .oneshot(Call {
                request: CallRequest::default(),
                timeout,
                stream: None,
            })
            .await;
        called
    }

    #[tokio::test(start_paused = true)]
    async fn retries_through_the_stack_are_numbered_counted_and_within_the_budget() {
        let reach = FakeReach::new(vec![
            (1, Err(Code::Unavailable)),
            (1, Err(Code::Unavailable)),
            (1, Err(Code::Unavailable)),
        ]);
        // Half a retry earned per call; a layer's services share its budget.
        let policy = PolicyLayer::new(ClientPolicy {
            retries: 3,
            retry_budget: 0.5,
            ..ClientPolicy::default()
        });
        let stack = layers(None, None, policy).service(reach.clone());
        let mut extra = Vec::new();
        for _ in 0..2 {
            let Ok(called) = stack
                .clone()
                .oneshot(Call {
                    request: CallRequest::default(),
                    timeout: Some(Duration::from_secs(1)),
                    stream: None,
                })
                .await;
            assert_eq!(
                called.result.map(drop).map_err(|s| s.code()),
                Err(Code::Unavailable)
            );
            assert_eq!(called.attempts.len() as u32, called.extra_attempts + 1);
            extra.push(called.extra_attempts);
        }
        // The first call earned half a token: no retry; the second a whole
        // one: one retry, numbered 1, then the budget was spent.
        assert_eq!(extra, [0, 1]);
        let attempts: Vec<u32> = reach.seen().into_iter().map(|(n, _)| n).collect();
        assert_eq!(attempts, [0, 0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_through_the_stack_wins_and_each_attempt_gets_the_least_timeout() {
        let reach = FakeReach::new(vec![(100, Ok(())), (5, Ok(()))]);
        let policy = PolicyLayer::new(ClientPolicy {
            timeout: Some(Duration::from_millis(50)),
            hedge: Some(Hedge::After(Duration::from_millis(10))),
            ..ClientPolicy::default()
        });
        let start = Instant::now();
        let called = call_as_hop(&reach, &policy, Some(Duration::from_millis(200))).await;
        assert_eq!(called.result.map(|r| r.request_id).ok(), Some(1));
        assert_eq!(called.extra_attempts, 1);
        assert_eq!(start.elapsed(), Duration::from_millis(15));
        // Each attempt's budget: the policy's 50 ms, below what was left of
        // the caller's 200 ms.
        let ms = Some(Duration::from_millis(50));
        assert_eq!(reach.seen(), [(0, ms), (1, ms)]);
        // With less of the deadline left than the policy's timeout, that.
        let reach = FakeReach::new(vec![(1, Ok(()))]);
        let called = call_as_hop(&reach, &policy, Some(Duration::from_millis(20))).await;
        assert!(called.result.is_ok());
        assert_eq!(reach.seen(), [(0, Some(Duration::from_millis(20)))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_deadline_is_refused_before_any_attempt_and_names_the_caller() {
        let reach = FakeReach::new(vec![(1, Ok(()))]);
        let policy = PolicyLayer::new(ClientPolicy::default());
        let called = call_as_hop(&reach, &policy, Some(Duration::ZERO)).await;
        let status = called
            .result
            .err()
            .map(|s| (s.code(), s.message().to_owned()));
        assert_eq!(
            status,
            Some((
                Code::DeadlineExceeded,
                "hop \"a\": deadline passed before calling downstream".to_owned()
            ))
        );
        assert_eq!((called.extra_attempts, called.attempts.len()), (0, 0));
        assert!(reach.seen().is_empty(), "no attempt went");
        // Time left, or no deadline: the call goes.
        let called = call_as_hop(&reach, &policy, None).await;
        assert!(called.result.is_ok());
        assert_eq!(reach.seen(), [(0, None)]);
    }
}

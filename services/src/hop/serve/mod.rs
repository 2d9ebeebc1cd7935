//! The serving stack: how a hop replica serves one request, as tower
//! layers around its work ([`Work`]), composed once in `ServeStack::new`.
//!
//! From the outside in, for one request:
//!
//! - [`span`]: the hop's server span, child of the caller's context, ended
//!   the hop record's `total_ns` after its start (`ServerSpanLayer`);
//! - [`record`]: the hop's own [`HopRecord`] appended to the reply's path
//!   (`RecordLayer`);
//! - [`fan_out`]: once the hop's own work is done, its downstream calls,
//!   stage by stage, drawn per request, through their call stacks
//!   (`FanOutLayer`);
//! - [`slot`]: the replica's capacity, held for its own work only: a slot
//!   when its concurrency is limited (the wait for one is queue wait,
//!   bounded by the deadline) and a pull worker's broker credit
//!   (`SlotLayer`);
//! - [`faults`]: the request's plan under the behaviour the Control API
//!   may override: the work drawn, injected slowness after the work, an
//!   injected error (`FaultLayer`);
//! - [`work`]: the work itself, synthetic or a call of the hop's service
//!   (`Work`).
//!
//! The request through the stack is a [`HopRequest`] and the answer a
//! [`Served`], generic over the payload, so the same layers can wrap
//! other work than a `CallRequest`'s. Like the call stack's, a layer's
//! service is a cheap clone (its state is shared behind `Arc`s): every
//! request runs on its own clone of the stack built once per replica.

pub mod fan_out;
pub mod faults;
pub mod record;
pub mod slot;
pub mod span;
pub mod work;

use std::time::Duration;

pub use fan_out::FanOutLayer;
pub use faults::FaultLayer;
pub use record::RecordLayer;
pub use slot::SlotLayer;
pub use span::ServerSpanLayer;
use tailmesh_proto::pb::{CallTiming, HopRecord};
use tokio::time::Instant;
use tonic::Status;
use tower::{ServiceBuilder, ServiceExt};
pub use work::Work;

use super::draw::PlannedWork;
use crate::{broker::Release, telemetry::SpanContext};

/// One request as the serving layers see it.
pub struct HopRequest<P> {
    /// When the request reached this hop: what the record's `total_ns`
    /// counts from.
    pub arrived: Instant,
    /// Its server span's start and parent; `None`: the caller keeps no
    /// span for it.
    pub span: Option<SpanStart>,
    pub request_id: u64,
    /// Which attempt of its caller this is (0 for the first).
    pub attempt: u32,
    /// The calling hop (empty for the load generator).
    pub caller: String,
    /// Whether the caller slowed this request with injected slowness.
    pub caller_slow: bool,
    /// Which visit of the request to this hop this is (`CallRequest`'s
    /// `branch`): the hop's draws are keyed on `request_id ^ branch`.
    pub branch: u64,
    /// The caller's deadline (`None`: none).
    pub deadline: Option<Instant>,
    /// Time the request already spent waiting before this hop took it:
    /// in a broker queue (pull), or behind the earlier messages of its
    /// stream.
    pub queue_wait: Duration,
    /// A pull worker's broker credit, given back once the hop's own work
    /// is done.
    pub release: Option<Release>,
    /// The synthetic work drawn for this request (set by the fault layer).
    pub work: Option<PlannedWork>,
    /// The streams to this hop's streaming downstream hops, when the
    /// request is a message of a stream the hop serves.
    pub stream: Option<crate::hop::stream::Streams>,
    pub payload: P,
}

/// When a server span starts and its parent.
#[derive(Clone, Copy, Debug)]
pub struct SpanStart {
    /// Unix nanoseconds, read at the same moment as
    /// [`HopRequest::arrived`].
    pub started: u64,
    /// The caller's trace context, if it sent one.
    pub parent: Option<SpanContext>,
}

/// What the layers learnt while serving one request, with the reply; each
/// layer fills in its own part.
#[derive(Debug)]
pub struct Served<R> {
    pub reply: R,
    /// The hop's own work, injected slowness included.
    pub service: Duration,
    /// Whether the hop slowed the request with injected slowness.
    pub slow: bool,
    /// Time in a queue: the broker's and the wait for a slot.
    pub queue_wait: Duration,
    /// The part of `queue_wait` spent waiting for a slot.
    pub slot_wait: Duration,
    /// The calls of the downstream hops, in the order made.
    pub calls: Vec<CallTiming>,
    /// Retries and hedges of those calls.
    pub extra_attempts: u32,
    /// From the first downstream call's start to the last one's end.
    pub downstream: Duration,
    /// The path so far: the downstream hops' records, then (once the
    /// record layer has run) this hop's own, last.
    pub path: Vec<HopRecord>,
}

impl<R> Served<R> {
    /// `reply`, before the layers have added to it.
    pub fn new(reply: R) -> Self {
        Served {
            reply,
            service: Duration::ZERO,
            slow: false,
            queue_wait: Duration::ZERO,
            slot_wait: Duration::ZERO,
            calls: Vec::new(),
            extra_attempts: 0,
            downstream: Duration::ZERO,
            path: Vec::new(),
        }
    }
}

/// The serving stack of a tailmesh hop replica (see the module's
/// documentation), over its work.
pub(crate) type Service =
    span::ServerSpan<record::Record<fan_out::FanOut<slot::SlotGate<faults::Faults<Work>>>>>;

/// The one composition of a replica's stack, built once; the layers run
/// top to bottom.
pub(crate) fn stack(
    span: ServerSpanLayer,
    record: RecordLayer,
    fan_out: FanOutLayer,
    slot: SlotLayer,
    faults: FaultLayer,
    work: Work,
) -> Service {
    ServiceBuilder::new()
        // Outermost, so the span covers everything the hop does and ends
        // with the record's total.
        .layer(span)
        // The record's total counts the downstream calls, and its fields
        // are read from what every layer below found.
        .layer(record)
        // Downstream calls wait for the own work and slowness, but not
        // holding a slot or the broker credit.
        .layer(fan_out)
        // The slot and credit are held for the own work and slowness only.
        .layer(slot)
        // Slowness and errors are the hop's own: after its work, inside
        // its service time.
        .layer(faults)
        .service(work)
}

/// Serves `request` through a clone of `service`.
pub(crate) async fn serve(
    service: &Service,
    request: HopRequest<bytes::Bytes>,
) -> Result<Served<bytes::Bytes>, Status> {
    service.clone().oneshot(request).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tonic::Code;

    use super::*;
    use crate::{
        discipline::Discipline,
        hop::{serve::faults::Behavior, slots::Slots},
        model::{DurationDist, ErrorInjection, HopBehavior, Slowness, Transport, Work as Model},
        timer::Sleeper,
    };

    const MS: Duration = Duration::from_millis(1);

    /// A replica of hop "x" whose work is a 2 ms sleep on tokio's clock
    /// (paused in the tests, so times are exact), one request at a time,
    /// under `faults`.
    fn replica(faults: impl FnOnce(&mut HopBehavior)) -> Service {
        let mut behavior = HopBehavior {
            work: Model::Sleep {
                dist: DurationDist::Fixed { value: 2 * MS },
            },
            ..HopBehavior::idle("x", 7)
        };
        faults(&mut behavior);
        stack(
            ServerSpanLayer::new("x"),
            RecordLayer::new("x", 0, Transport::Push),
            FanOutLayer::new("x", Arc::from(Vec::new()), &Default::default(), 7),
            SlotLayer::new("x", 0, Some(Slots::new(1, Some(8), Discipline::Fifo))),
            FaultLayer::new(Arc::new(Behavior::new(behavior, 0)), Sleeper::Tokio),
            Work::new("x", 0, Sleeper::Tokio, None),
        )
    }

    fn request(
        id: u64,
        deadline: Option<Duration>,
        queue_wait: Duration,
    ) -> HopRequest<bytes::Bytes> {
        let arrived = Instant::now();
        HopRequest {
            arrived,
            span: None,
            request_id: id,
            attempt: 0,
            caller: "up".to_owned(),
            caller_slow: false,
            branch: 0,
            deadline: deadline.map(|d| arrived + d),
            queue_wait,
            release: None,
            work: None,
            stream: None,
            payload: bytes::Bytes::from_static(b"p"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slowness_is_service_time_after_the_work_and_a_slot_wait_is_queue_wait() {
        let service = replica(|b| {
            b.slow = Some(Slowness {
                probability: 1.0,
                extra: DurationDist::Fixed { value: 3 * MS },
                follow: None,
            });
        });
        let (first, second) = tokio::join!(
            serve(&service, request(1, None, Duration::ZERO)),
            serve(&service, request(2, None, MS)),
        );
        let own = |served: Result<Served<bytes::Bytes>, Status>| {
            let served = served.expect("served");
            assert_eq!(served.reply, bytes::Bytes::from_static(b"p"));
            served.path.last().cloned().expect("the hop's record")
        };
        let (first, second) = (own(first), own(second));
        let ns = |d: Duration| d.as_nanos() as u64;
        // Work 2 ms, then 3 ms slower: 5 ms of service, the whole total.
        assert_eq!(
            (
                first.service_ns,
                first.total_ns,
                first.slow,
                first.parent.as_str()
            ),
            (ns(5 * MS), ns(5 * MS), true, "up")
        );
        assert_eq!((first.queue_wait_ns, first.slot_wait_ns), (0, 0));
        // The second waited for the slot all of the first's service time,
        // queue wait beside the broker's 1 ms.
        assert_eq!(
            (
                second.service_ns,
                second.total_ns,
                second.slot_wait_ns,
                second.queue_wait_ns
            ),
            (ns(5 * MS), ns(10 * MS), ns(5 * MS), ns(6 * MS))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_injected_error_comes_after_the_work_and_frees_the_slot() {
        let service = replica(|b| {
            b.error = Some(ErrorInjection {
                probability: 1.0,
                code: Code::Unavailable as i32,
            });
        });
        for id in 1..=2 {
            let start = Instant::now();
            let status = serve(&service, request(id, Some(3 * MS), Duration::ZERO))
                .await
                .err()
                .map(|s| (s.code(), s.message().to_owned()));
            assert_eq!(
                status,
                Some((
                    Code::Unavailable,
                    "injected error at hop \"x\" replica 0".to_owned()
                ))
            );
            // Failed after its 2 ms of work; the second was not kept out
            // by a slot the first still held.
            assert_eq!(start.elapsed(), 2 * MS);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_leaves_the_line_at_its_deadline() {
        let service = replica(|_| {});
        let (first, second) =
            tokio::join!(serve(&service, request(1, None, Duration::ZERO)), async {
                let start = Instant::now();
                let served = serve(&service, request(2, Some(MS), Duration::ZERO)).await;
                (served.err().map(|s| s.code()), start.elapsed())
            },);
        assert!(first.is_ok());
        assert_eq!(second, (Some(Code::DeadlineExceeded), MS));
    }
}

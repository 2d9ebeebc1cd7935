//! What a pull task carries through any broker, at the bottom of the pull
//! backends: the headers an external broker's message holds where
//! tailmesh's broker has fields of its own (W3C trace context, the absolute
//! deadline, the enqueue time; on replies the gRPC code and message), how a
//! task and a reply are read back from them, a task's deadline on the wall
//! clock, and the one wait that holds a handler to it.
//!
//! Every worker hands its handler the same [`pb::Task`] whichever broker it
//! serves, so a hop's handler does not know which broker it serves.

use std::{
    collections::HashMap,
    future::Future,
    time::{Duration, UNIX_EPOCH},
};

use tailmesh_proto::pb;
use tailmesh_units::{nanos, unix_nanos};
use tonic::{Code, Status};

use crate::telemetry;

/// Header: the task's absolute deadline, Unix nanoseconds (absent: none).
pub(crate) const DEADLINE_HEADER: &str = "tm-deadline";
/// Header: when the producer enqueued the task, Unix nanoseconds.
pub(crate) const ENQUEUED_HEADER: &str = "tm-enqueued";
/// Reply header: the gRPC code of the worker's answer (absent: OK).
pub(crate) const CODE_HEADER: &str = "tm-code";
/// Reply header: the status message of an error answer.
pub(crate) const MESSAGE_HEADER: &str = "tm-message";
/// Deliveries a task may have (the first and redeliveries after a lost
/// worker), as tailmesh's broker's default.
pub(crate) const MAX_DELIVERIES: u32 = 3;
/// How long a worker may hold a task without a sign of life before the
/// broker (JetStream) gives it to another worker; workers signal progress
/// at a third of it.
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(2);
/// Extra time a producer waits for the reply beyond the task's deadline,
/// so a worker's own DEADLINE_EXCEEDED, which says where the time went,
/// arrives before the producer gives up.
pub(crate) const REPLY_SLACK: Duration = Duration::from_millis(20);

/// A task's deadline, read off the clock once, when the caller hands the
/// task over: what a producer waits locally (`left`) and what the task
/// carries (`unix_nanos`) then agree, however long the producer takes to
/// connect or to find room before the task goes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline {
    /// The time the caller still waits, from the moment it was read.
    pub(crate) left: Duration,
    /// The same moment plus `left`, Unix nanoseconds.
    pub(crate) unix_nanos: u64,
}

impl Deadline {
    /// The deadline `left` from now.
    pub(crate) fn after(left: Duration) -> Self {
        Deadline {
            left,
            unix_nanos: unix_nanos().saturating_add(nanos(left)),
        }
    }

    /// The deadline of a call that waits `left` (`None`: for ever).
    pub(crate) fn of(left: Option<Duration>) -> Option<Self> {
        left.map(Self::after)
    }

    /// The absolute deadline a task carries, 0 for none.
    pub(crate) fn unix_nanos_of(deadline: Option<Self>) -> u64 {
        deadline.map_or(0, |d| d.unix_nanos)
    }
}

/// The headers an external broker's task carries: the caller's (trace
/// context) plus deadline and enqueue time.
pub(crate) fn task_headers(
    mut headers: HashMap<String, String>,
    deadline: Option<Deadline>,
) -> HashMap<String, String> {
    if let Some(deadline) = deadline {
        headers.insert(DEADLINE_HEADER.into(), deadline.unix_nanos.to_string());
    }
    headers.insert(ENQUEUED_HEADER.into(), unix_nanos().to_string());
    headers
}

/// A number header, 0 when absent or unreadable.
pub(crate) fn number(headers: &HashMap<String, String>, key: &str) -> u64 {
    headers
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// A task as an external broker's worker receives it, before it decides
/// whether to work on it.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) topic: String,
    /// The broker's id of the message (stream sequence, delivery tag).
    pub(crate) task_id: u64,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: HashMap<String, String>,
    /// Which delivery this is, from 1.
    pub(crate) delivery: u32,
}

impl Received {
    /// The task's absolute deadline, Unix nanoseconds (0 = none).
    pub(crate) fn deadline_unix_nanos(&self) -> u64 {
        number(&self.headers, DEADLINE_HEADER)
    }

    /// The task to hand the handler, taken at `taken` (Unix nanoseconds),
    /// or `None` if its deadline had passed by then: nobody waits for it
    /// any more, so it is not worked on. One clock reading decides both,
    /// so a task is never started after the deadline it was checked
    /// against.
    ///
    /// Its queue wait runs from the enqueue time header to `taken`; when
    /// the task is traced, a "queue wait <topic>" span covering it goes
    /// between the caller's span and the worker's, as tailmesh's broker
    /// records one.
    pub(crate) fn take_at(self, taken: u64) -> Option<pb::Task> {
        let deadline_unix_nanos = self.deadline_unix_nanos();
        if deadline_unix_nanos > 0 && taken >= deadline_unix_nanos {
            return None;
        }
        let Received {
            topic,
            task_id,
            payload,
            mut headers,
            delivery,
        } = self;
        let enqueued = number(&headers, ENQUEUED_HEADER).min(taken);
        let queue_wait_ns = taken - enqueued;
        let parent = telemetry::take_from_headers(&mut headers);
        // The worker's process is the hop's replica: its hop, transport and
        // variant are its resource.
        let cx = telemetry::past_span(
            || format!("queue wait {topic}").into(),
            UNIX_EPOCH + Duration::from_nanos(enqueued),
            telemetry::SpanFields {
                queue_wait_ns: Some(queue_wait_ns),
                ..telemetry::SpanFields::default()
            },
            parent,
        );
        Some(pb::Task {
            task_id,
            payload,
            deadline_unix_nanos,
            headers,
            queue_wait_ns,
            delivery,
            trace: cx.as_ref().map(telemetry::wire),
        })
    }
}

/// The reply headers of a worker's answer.
pub(crate) fn reply_headers(outcome: &Result<Vec<u8>, Status>) -> Vec<(&'static str, String)> {
    match outcome {
        Ok(_) => Vec::new(),
        Err(status) => vec![
            (CODE_HEADER, (status.code() as i32).to_string()),
            (MESSAGE_HEADER, status.message().to_owned()),
        ],
    }
}

/// A worker's answer read back from its reply's headers and payload: the
/// payload, or the status the worker answered with.
pub(crate) fn reply_of(
    code: Option<&str>,
    message: Option<&str>,
    payload: Vec<u8>,
) -> Result<Vec<u8>, Status> {
    match code.and_then(|c| c.parse::<i32>().ok()).map(Code::from) {
        None | Some(Code::Ok) => Ok(payload),
        Some(code) => Err(Status::new(code, message.unwrap_or_default().to_owned())),
    }
}

/// Runs a worker's handler `work` until the task's wall-clock deadline
/// (Unix nanoseconds, 0 = none); past it the handler is dropped and the
/// task answered DEADLINE_EXCEEDED. Every broker's worker waits this way.
pub(crate) async fn within_deadline<F>(work: F, deadline_unix_nanos: u64) -> Result<Vec<u8>, Status>
where
    F: Future<Output = Result<Vec<u8>, Status>>,
{
    if deadline_unix_nanos == 0 {
        return work.await;
    }
    let remaining = Duration::from_nanos(deadline_unix_nanos.saturating_sub(unix_nanos()));
    tokio::time::timeout(remaining, work)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(
                "the worker's handler ran past the task's deadline",
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(headers: &[(&str, u64)]) -> Received {
        Received {
            topic: "b".into(),
            task_id: 7,
            payload: b"x".to_vec(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_string()))
                .collect(),
            delivery: 2,
        }
    }

    #[test]
    fn a_task_is_taken_only_before_its_deadline() {
        let task = received(&[(DEADLINE_HEADER, 1_000), (ENQUEUED_HEADER, 400)]);
        let taken = task.take_at(999).expect("before its deadline");
        assert_eq!(
            (taken.task_id, taken.delivery, taken.deadline_unix_nanos),
            (7, 2, 1_000)
        );
        assert_eq!(taken.queue_wait_ns, 599);
        let late = received(&[(DEADLINE_HEADER, 1_000), (ENQUEUED_HEADER, 400)]);
        assert!(late.take_at(1_000).is_none(), "at its deadline");
        let none = received(&[(ENQUEUED_HEADER, 400)]);
        assert_eq!(
            none.take_at(u64::MAX).map(|t| t.deadline_unix_nanos),
            Some(0)
        );
    }

    #[test]
    fn a_deadline_is_read_once() {
        let before = unix_nanos();
        let d = Deadline::after(Duration::from_millis(400));
        let after = unix_nanos();
        assert!(d.unix_nanos >= before + 400_000_000 && d.unix_nanos <= after + 400_000_000);
        let headers = task_headers(HashMap::new(), Some(d));
        assert_eq!(number(&headers, DEADLINE_HEADER), d.unix_nanos);
        assert!(number(&headers, ENQUEUED_HEADER) >= after);
        assert!(!task_headers(HashMap::new(), None).contains_key(DEADLINE_HEADER));
        assert_eq!(Deadline::unix_nanos_of(None), 0);
    }

    #[test]
    fn a_reply_reads_back_as_it_was_answered() {
        let failed: Result<Vec<u8>, Status> = Err(Status::unavailable("gone"));
        let headers: HashMap<_, _> = reply_headers(&failed).into_iter().collect();
        let read = reply_of(
            headers.get(CODE_HEADER).map(String::as_str),
            headers.get(MESSAGE_HEADER).map(String::as_str),
            Vec::new(),
        )
        .expect_err("an error answer");
        assert_eq!((read.code(), read.message()), (Code::Unavailable, "gone"));
        assert!(reply_headers(&Ok(b"ok".to_vec())).is_empty());
        assert_eq!(
            reply_of(None, None, b"ok".to_vec()).ok(),
            Some(b"ok".to_vec())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_past_the_deadline_is_deadline_exceeded() {
        let deadline = unix_nanos() + nanos(Duration::from_millis(50));
        let slow = within_deadline(
            async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(Vec::new())
            },
            deadline,
        )
        .await;
        assert_eq!(slow.map_err(|s| s.code()), Err(Code::DeadlineExceeded));
        let quick = within_deadline(async { Ok(b"x".to_vec()) }, deadline).await;
        assert_eq!(quick.ok(), Some(b"x".to_vec()));
        let unbounded = within_deadline(async { Ok(Vec::new()) }, 0).await;
        assert!(unbounded.is_ok());
    }
}

//! The broker's per-topic statistics as summary.json holds them: the
//! analysis's own type, converted from the broker's protobuf reply at the
//! orchestrator's edge (`tailmesh::wire`), so a change to the wire format
//! never silently changes the file's schema.

use serde::{Deserialize, Serialize};

/// One broker topic's statistics at the end of a variant (summary.json's
/// `variants[].broker[]`); queue wait values are in ns. A field missing
/// from an older summary reads as 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BrokerTopicStats {
    /// The topic: the pulled hop's name.
    pub topic: String,
    /// Submits accepted by the topic (those already past their deadline count
    /// here and in `expired`): every one ends in exactly one of completed,
    /// failed, expired, expired_in_flight, lost, abandoned,
    /// shutdown_unanswered, shed.
    pub enqueued: u64,
    /// Deliveries to workers, redeliveries included.
    pub dispatched: u64,
    /// Answered with a worker's OK result.
    pub completed: u64,
    /// Answered with a worker's error status.
    pub failed: u64,
    /// Deadline passed before dispatch (while queued, or already on arrival):
    /// answered DEADLINE_EXCEEDED, never dispatched.
    pub expired: u64,
    /// Deadline passed while a worker held the task.
    pub expired_in_flight: u64,
    /// Refused with RESOURCE_EXHAUSTED because the topic was full: at its limit
    /// in tasks (queue_capacity) or in queued payload bytes (queue_bytes).
    pub rejected_full: u64,
    /// Put back at the head of the queue after their worker went away.
    pub redelivered: u64,
    /// Answered ABORTED after losing max_deliveries workers.
    pub lost: u64,
    /// The producer gave up (cancelled its call, or its grpc-timeout fired).
    pub abandoned: u64,
    /// Worker results nobody was waiting for any more; ignored.
    pub late_results: u64,
    /// Answered UNAVAILABLE because the broker shut down first.
    pub shutdown_unanswered: u64,
    /// Tasks queued now, and the most ever queued at once.
    pub depth: u64,
    /// The most tasks ever queued at once.
    pub max_depth: u64,
    /// Tasks held by workers now, and workers connected now.
    pub in_flight: u64,
    /// Workers connected at the end.
    pub workers: u32,
    /// Queue wait (enqueue to the delivery that answered) of tasks answered by
    /// a worker, in ns.
    pub queue_wait_count: u64,
    /// Queue wait median, ns.
    pub queue_wait_p50_ns: u64,
    /// Queue wait 90th percentile, ns.
    pub queue_wait_p90_ns: u64,
    /// Queue wait 99th percentile, ns.
    pub queue_wait_p99_ns: u64,
    /// Queue wait 99.9th percentile, ns.
    pub queue_wait_p999_ns: u64,
    /// Longest queue wait, ns.
    pub queue_wait_max_ns: u64,
    /// Unused credit across connected workers now.
    pub credits: u64,
    /// Payload bytes of the tasks queued now, and the most ever queued at once
    /// (held tasks are not counted).
    pub depth_bytes: u64,
    /// The most payload bytes ever queued at once.
    pub max_depth_bytes: u64,
    /// The order the topic serves its queue in: "fifo", "lifo" or "adaptive".
    pub discipline: String,
    /// Queued tasks the discipline gave up on (adaptive, over a standing
    /// queue): answered RESOURCE_EXHAUSTED, never dispatched.
    pub shed: u64,
}

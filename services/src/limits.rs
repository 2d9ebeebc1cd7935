//! How big the messages that carry a request's payload may be: one
//! definition shared by the scenario validator, the hop's server and
//! clients, the load generator and the broker, so a payload the scenario
//! accepts fits every message it travels in.
//!
//! A payload travels inside a hop message (`CallRequest` down, `CallReply`
//! back with one path record per hop visited); through the broker that hop
//! message is itself the payload of a broker message (`Task`,
//! `TaskResult`, the submit stream's messages), which adds its own fields.
//! Each wrapping adds at most [`MESSAGE_OVERHEAD`].
//!
//! It also holds the bound on a push replica's wait queue
//! ([`DEFAULT_QUEUE_LIMIT`]), for the same reason: the validator and the hop
//! share one definition.

/// The largest payload a request may carry, in bytes (4 MiB): the
/// scenario's `[load] payload` maximum.
pub const MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;

/// Room for a message's fields besides its payload, in bytes (1 MiB): ids,
/// field tags and lengths, trace headers and a reply's path records (one
/// record is under 220 bytes even with 63-character hop names, and each
/// downstream call it timed adds under 400 with 12 attempts, one hedge and
/// 10 retries after the first, so a reply through the most visits a
/// scenario allows a request, [`MAX_VISITS`], needs under 640 KiB).
/// Payloads themselves are checked exactly; this only sizes the gRPC
/// message limits.
pub const MESSAGE_OVERHEAD: usize = 1024 * 1024;

pub use tailmesh_model::calls::MAX_VISITS;

/// The largest hop message (`CallRequest` or `CallReply`), in bytes: the
/// gRPC message limit of the hop service and of every client that calls
/// it, and the largest task a broker serving hops must accept.
pub const MAX_CALL_MESSAGE_BYTES: usize = MAX_PAYLOAD_BYTES + MESSAGE_OVERHEAD;

/// The most the load generator may have in flight, in bytes of payload
/// and per-request state (1 GiB): the requests that can be in flight at
/// once (open loop: rate x timeout; closed loop: the concurrency) times
/// the payload plus [`IN_FLIGHT_REQUEST_BYTES`]. A scenario over it is
/// refused, so no process of a run can be asked to hold more than this
/// in requests, whatever the mesh does with them.
pub const MAX_IN_FLIGHT_BYTES: u64 = 1 << 30;

/// What one request in flight costs besides its payload, in bytes (8 KiB):
/// measured at 5 to 10 KiB per request waiting in the load generator and
/// in an overloaded hop (the call's state, its HTTP/2 stream, buffers).
pub const IN_FLIGHT_REQUEST_BYTES: u64 = 8 * 1024;

pub use tailmesh_model::DEFAULT_QUEUE_LIMIT;

/// The largest `queue_limit` a scenario may set: a bound that still bounds.
pub const MAX_QUEUE_LIMIT: u32 = 1_000_000;

#[cfg(test)]
mod tests {
    use prost::Message;
    use tailmesh_proto::pb::{
        AttemptEnd, AttemptTiming, CallReply, CallRequest, CallTiming, HopRecord,
    };

    use super::*;

    /// A path record with every field at its longest.
    fn widest_record() -> HopRecord {
        HopRecord {
            hop: "h".repeat(63),
            replica: u32::MAX,
            service_ns: u64::MAX,
            total_ns: u64::MAX,
            slow: true,
            queue_wait_ns: u64::MAX,
            parent: "p".repeat(63),
            transport: "push".to_owned(),
            extra_attempts: u32::MAX,
            slot_wait_ns: u64::MAX,
            calls: Vec::new(),
            downstream_ns: u64::MAX,
        }
    }

    /// A downstream call with every field at its longest: a first attempt,
    /// a hedge and 10 retries.
    fn widest_call() -> CallTiming {
        CallTiming {
            hop: "h".repeat(63),
            call_ns: u64::MAX,
            attempts: vec![
                AttemptTiming {
                    start_ns: u64::MAX,
                    took_ns: u64::MAX,
                    end: AttemptEnd::Cancelled as i32,
                };
                12
            ],
        }
    }

    #[test]
    fn a_full_payload_fits_a_request() {
        let request = CallRequest {
            request_id: u64::MAX,
            payload: vec![0; MAX_PAYLOAD_BYTES].into(),
            attempt: u32::MAX,
            caller: "c".repeat(63),
            caller_slow: true,
            branch: u64::MAX,
            // A stream's message carries these too.
            message: u64::MAX,
            timeout_ns: u64::MAX,
            stream_messages: u32::MAX,
            stream_stride: u64::MAX,
            stream_interval_ns: u64::MAX,
            trace: Some(tailmesh_proto::pb::TraceContext {
                trace_id_high: u64::MAX,
                trace_id_low: u64::MAX,
                span_id: u64::MAX,
                sampled: true,
            }),
        };
        assert!(request.encoded_len() <= MAX_CALL_MESSAGE_BYTES);
        assert!(request.encoded_len() > MAX_PAYLOAD_BYTES);
    }

    #[test]
    fn a_full_payload_fits_a_reply_through_the_most_visits() {
        let reply = CallReply {
            request_id: u64::MAX,
            payload: vec![0; MAX_PAYLOAD_BYTES].into(),
            // Each record with a call: more calls than such a path has.
            path: vec![
                HopRecord {
                    calls: vec![widest_call()],
                    ..widest_record()
                };
                MAX_VISITS as usize
            ],
            // On a stream, its number (a served message has no error).
            message: u64::MAX,
            ..Default::default()
        };
        assert!(
            reply.encoded_len() <= MAX_CALL_MESSAGE_BYTES,
            "{} bytes",
            reply.encoded_len()
        );
        assert!(widest_record().encoded_len() < 220);
        assert!(widest_call().encoded_len() < 400);
    }
}

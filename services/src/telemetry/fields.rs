//! A span's fixed fields ([`SpanFields`]) and the attribute values they
//! become ([`FieldValue`]): plain data shared by the recorder, which
//! keeps them on a span, and the context, which collects the fields set
//! on the current span while a future is polled.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::model::Transport;

/// `name` kept for the process's life, once: the names a process gives
/// its spans and their fields are few (its hop, its calls, its broker's
/// topics) and made once each, when its layers are built. A span then
/// refers to them with no reference count to touch on the serving
/// thread and again, on another core, where the exporter drops it.
pub fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match names.get(name) {
        Some(kept) => kept,
        None => {
            let kept: &'static str = Box::leak(name.into());
            names.insert(kept);
            kept
        }
    }
}

/// What a span says besides its ids, name, kind, times and status: a
/// fixed set of optional fields, set on the serving thread without
/// allocating (names are [`intern`]ed) and written as OTLP
/// attributes of the same names by the exporter. What is the same for
/// every span of a process (its hop, replica, transport and variant) is
/// in the process's resource instead (see [`super::Process`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpanFields {
    /// `hop`: only where a process serves several hops (the broker's
    /// topics); a hop's own is its resource's.
    pub hop: Option<&'static str>,
    /// `downstream`: the hop a client span calls.
    pub downstream: Option<&'static str>,
    /// `transport`: how a client span's downstream (or the broker's topic)
    /// is reached, where that is not the process's own.
    pub transport: Option<Transport>,
    /// `request_id`.
    pub request_id: Option<u64>,
    /// `slow`: whether injected slowness applied.
    pub slow: Option<bool>,
    /// `queue_wait_ns`: the request's wait in a queue before this hop.
    pub queue_wait_ns: Option<u64>,
    /// `slot_wait_ns`: the part of a server span spent waiting for a slot.
    pub slot_wait_ns: Option<u64>,
    /// `service_ns`: a hop's own time in a server span, its work and
    /// injected slowness as they took (no waits, no calls).
    pub service_ns: Option<u64>,
    /// `work_ns`: the sleep and injected slowness the hop drew for the
    /// request, as asked (not set for CPU work, whose time is the
    /// machine's): what a trace import reads as the service's own time.
    pub work_ns: Option<u64>,
    /// `grpc_code` (written as the code's description) of a failed span.
    pub grpc_code: Option<tonic::Code>,
}

impl SpanFields {
    /// No field set (a `const`, for thread-locals).
    pub const EMPTY: SpanFields = SpanFields {
        hop: None,
        downstream: None,
        transport: None,
        request_id: None,
        slow: None,
        queue_wait_ns: None,
        slot_wait_ns: None,
        service_ns: None,
        work_ns: None,
        grpc_code: None,
    };

    /// The fields set, in a fixed order, as the attribute each becomes:
    /// its key and value (numbers above `i64::MAX` are written as it).
    pub fn attributes(&self) -> impl Iterator<Item = (&'static str, FieldValue<'_>)> {
        let int = |n: u64| FieldValue::Int(i64::try_from(n).unwrap_or(i64::MAX));
        [
            ("hop", self.hop.map(FieldValue::Str)),
            ("downstream", self.downstream.map(FieldValue::Str)),
            (
                "transport",
                self.transport.map(|t| FieldValue::Str(t.as_str())),
            ),
            ("request_id", self.request_id.map(int)),
            ("slow", self.slow.map(FieldValue::Bool)),
            ("queue_wait_ns", self.queue_wait_ns.map(int)),
            ("slot_wait_ns", self.slot_wait_ns.map(int)),
            ("service_ns", self.service_ns.map(int)),
            ("work_ns", self.work_ns.map(int)),
            (
                "grpc_code",
                self.grpc_code.map(|c| FieldValue::Str(c.description())),
            ),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
    }

    /// Sets every field `other` sets.
    pub fn merge(&mut self, other: SpanFields) {
        let SpanFields {
            hop,
            downstream,
            transport,
            request_id,
            slow,
            queue_wait_ns,
            slot_wait_ns,
            service_ns,
            work_ns,
            grpc_code,
        } = other;
        fn set<T>(field: &mut Option<T>, value: Option<T>) {
            if value.is_some() {
                *field = value;
            }
        }
        set(&mut self.hop, hop);
        set(&mut self.downstream, downstream);
        set(&mut self.transport, transport);
        set(&mut self.request_id, request_id);
        set(&mut self.slow, slow);
        set(&mut self.queue_wait_ns, queue_wait_ns);
        set(&mut self.slot_wait_ns, slot_wait_ns);
        set(&mut self.service_ns, service_ns);
        set(&mut self.work_ns, work_ns);
        set(&mut self.grpc_code, grpc_code);
    }
}

/// A span field's value as an attribute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldValue<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
}

//! The mesh's protobuf answers turned into the analysis's plain data, once,
//! at the orchestrator's edge: a reply's path and attempts (the load
//! generator), a caller pool's endpoint events, the broker's topic
//! statistics. `tailmesh-analysis` knows no protobuf; this module is the
//! one place that knows both.

use tailmesh_proto::pb;

use crate::{
    analysis::{BrokerTopicStats, CallerEndpoints, EndpointEvent, ReplicaCounts},
    record::{AttemptTiming, CallTiming, GrpcCode, HopRecord},
};

/// Unix ns on this machine's wall clock placed on `clock`'s measured clock,
/// in seconds, by one reading of both clocks now.
pub(crate) fn measured_seconds(clock: &crate::loadgen::LoadClock) -> impl Fn(u64) -> f64 + use<> {
    let now = tokio::time::Instant::now();
    let now_unix_ns = tailmesh_units::unix_nanos();
    let measured_now = clock.measured_s(now);
    move |unix_ns| measured_now - (now_unix_ns as f64 - unix_ns as f64) / 1e9
}

/// The caller name of the load generator's entry pools, in endpoint views
/// and a kill's picks: this process's.
pub(crate) const LOADGEN_CALLER: &str = "loadgen";

/// The caller name of generator process `index`'s entry pools.
pub(crate) fn generator_caller(index: u32) -> String {
    format!("{LOADGEN_CALLER}/{index}")
}

/// What a load generator's entry `pools` did with their hops' replicas, as
/// `caller`, their events placed by `measured_s`.
pub(crate) fn pools_endpoints(
    caller: &str,
    pools: &[std::sync::Arc<tailmesh_services::hop::PushPool>],
    measured_s: impl Fn(u64) -> f64,
) -> Vec<CallerEndpoints> {
    pools
        .iter()
        .map(|pool| caller_endpoints(caller, &pool.endpoint_events(), &measured_s))
        .collect()
}

/// The calls sent so far to `hop`'s `replica` by the one of `pools` that
/// pushes to `hop`; `None` when none does, or the hop has no such replica.
pub(crate) fn pool_picks(
    pools: &[std::sync::Arc<tailmesh_services::hop::PushPool>],
    hop: &str,
    replica: u32,
) -> Option<u64> {
    let pool = pools.iter().find(|pool| pool.hop() == hop)?;
    replica_picks(&pool.endpoint_events(), hop, replica)
}

/// The calls a caller's pool `events` says it sent to `hop`'s `replica`;
/// `None` when the pool calls another hop, or has no such replica.
pub(crate) fn replica_picks(events: &pb::PoolEvents, hop: &str, replica: u32) -> Option<u64> {
    (events.hop == hop)
        .then(|| events.replicas.get(replica as usize).map(|r| r.picks))
        .flatten()
}

/// A tonic status code as the records name it.
pub(crate) fn grpc_code(code: tonic::Code) -> GrpcCode {
    GrpcCode::from_i32(code as i32)
}

/// A reply's path, converted once from the wire.
pub(crate) fn path_of(path: Vec<pb::HopRecord>) -> Vec<HopRecord> {
    path.into_iter().map(hop_record).collect()
}

/// One hop of a reply's path, from the wire.
pub(crate) fn hop_record(h: pb::HopRecord) -> HopRecord {
    HopRecord {
        hop: h.hop,
        replica: h.replica,
        service_ns: h.service_ns,
        total_ns: h.total_ns,
        slow: h.slow,
        queue_wait_ns: h.queue_wait_ns,
        parent: h.parent,
        transport: h.transport,
        extra_attempts: h.extra_attempts,
        slot_wait_ns: h.slot_wait_ns,
        downstream_ns: h.downstream_ns,
        calls: h
            .calls
            .into_iter()
            .map(|c| CallTiming {
                hop: c.hop,
                call_ns: c.call_ns,
                attempts: attempts_of(c.attempts),
            })
            .collect(),
    }
}

/// A call's attempts, from the wire.
pub(crate) fn attempts_of(attempts: Vec<pb::AttemptTiming>) -> Vec<AttemptTiming> {
    attempts
        .into_iter()
        .map(|a| AttemptTiming {
            start_ns: a.start_ns,
            took_ns: a.took_ns,
            end: a.end,
        })
        .collect()
}

/// A topic's statistics as summary.json holds them, from the broker's
/// reply.
pub(crate) fn broker_topic_stats(t: pb::TopicStats) -> BrokerTopicStats {
    {
        BrokerTopicStats {
            topic: t.topic,
            enqueued: t.enqueued,
            dispatched: t.dispatched,
            completed: t.completed,
            failed: t.failed,
            expired: t.expired,
            expired_in_flight: t.expired_in_flight,
            rejected_full: t.rejected_full,
            redelivered: t.redelivered,
            lost: t.lost,
            abandoned: t.abandoned,
            late_results: t.late_results,
            shutdown_unanswered: t.shutdown_unanswered,
            depth: t.depth,
            max_depth: t.max_depth,
            in_flight: t.in_flight,
            workers: t.workers,
            queue_wait_count: t.queue_wait_count,
            queue_wait_p50_ns: t.queue_wait_p50_ns,
            queue_wait_p90_ns: t.queue_wait_p90_ns,
            queue_wait_p99_ns: t.queue_wait_p99_ns,
            queue_wait_p999_ns: t.queue_wait_p999_ns,
            queue_wait_max_ns: t.queue_wait_max_ns,
            credits: t.credits,
            depth_bytes: t.depth_bytes,
            max_depth_bytes: t.max_depth_bytes,
            discipline: t.discipline,
            shed: t.shed,
        }
    }
}

/// `pool` as seen by `caller`; an event stamped `unix_ns` is placed on
/// the measured clock by `measured_s(unix_ns)`.
pub(crate) fn caller_endpoints(
    caller: &str,
    pool: &pb::PoolEvents,
    measured_s: impl Fn(u64) -> f64,
) -> CallerEndpoints {
    CallerEndpoints {
        caller: caller.to_owned(),
        hop: pool.hop.clone(),
        replicas: pool
            .replicas
            .iter()
            .map(|r| ReplicaCounts {
                picks: r.picks,
                transient_failures: r.transient_failures,
                failed_connects: r.failed_connects,
                keepalive_timeouts: r.keepalive_timeouts,
                redirected: r.redirected,
                ejections: r.ejections,
                readmissions: r.readmissions,
            })
            .collect(),
        events: pool
            .events
            .iter()
            .map(|e| EndpointEvent {
                at_s: measured_s(e.unix_ns),
                replica: e.replica,
                kind: kind_name(e.kind).to_owned(),
                reason: e.reason.clone(),
            })
            .collect(),
        dropped: pool.dropped,
    }
}

/// The name of an event kind, as summary.json writes it.
fn kind_name(kind: i32) -> &'static str {
    match pb::EndpointEventKind::try_from(kind) {
        Ok(pb::EndpointEventKind::TransientFailure) => "transient_failure",
        Ok(pb::EndpointEventKind::Ready) => "ready",
        Ok(pb::EndpointEventKind::Ejected) => "ejected",
        Ok(pb::EndpointEventKind::Readmitted) => "readmitted",
        _ => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::AttemptEnd;

    #[test]
    fn a_path_converts_field_for_field() {
        let wire = pb::HopRecord {
            hop: "b".into(),
            replica: 2,
            service_ns: 3,
            total_ns: 4,
            slow: true,
            queue_wait_ns: 5,
            parent: "a".into(),
            transport: "pull".into(),
            extra_attempts: 6,
            slot_wait_ns: 7,
            downstream_ns: 11,
            calls: vec![pb::CallTiming {
                hop: "c".into(),
                call_ns: 8,
                attempts: vec![pb::AttemptTiming {
                    start_ns: 9,
                    took_ns: 10,
                    end: pb::AttemptEnd::Cancelled as i32,
                }],
            }],
        };
        let plain = hop_record(wire);
        assert_eq!(
            (
                plain.hop.as_str(),
                plain.replica,
                plain.service_ns,
                plain.total_ns
            ),
            ("b", 2, 3, 4)
        );
        assert!(plain.slow);
        assert_eq!(
            (
                plain.queue_wait_ns,
                plain.parent.as_str(),
                plain.transport.as_str()
            ),
            (5, "a", "pull")
        );
        assert_eq!(
            (
                plain.extra_attempts,
                plain.slot_wait_ns,
                plain.downstream_ns
            ),
            (6, 7, 11)
        );
        let call = &plain.calls[0];
        assert_eq!((call.hop.as_str(), call.call_ns), ("c", 8));
        assert_eq!(
            call.attempts,
            vec![AttemptTiming {
                start_ns: 9,
                took_ns: 10,
                end: AttemptEnd::Cancelled as i32
            }]
        );
        assert_eq!(call.attempts[0].end(), AttemptEnd::Cancelled);
    }

    #[test]
    fn tonic_codes_keep_their_names() {
        for n in 0..=16 {
            let code = tonic::Code::from_i32(n);
            assert_eq!(format!("{:?}", grpc_code(code)), format!("{code:?}"));
        }
    }

    #[test]
    fn it_writes_the_same_json_as_the_protobuf_type() {
        let wire = pb::TopicStats {
            topic: "b".into(),
            enqueued: 10,
            completed: 9,
            expired: 1,
            max_depth: 4,
            workers: 2,
            queue_wait_p99_ns: 1_500_000,
            discipline: "fifo".into(),
            shed: 3,
            ..pb::TopicStats::default()
        };
        let ours = broker_topic_stats(wire.clone());
        let (a, b) = (
            serde_json::to_value(&wire).expect("serialize"),
            serde_json::to_value(&ours).expect("serialize"),
        );
        assert_eq!(a, b);
        assert_eq!(b["queue_wait_p99_ns"], 1_500_000);
        // An older summary without the newer fields still reads.
        let old: BrokerTopicStats =
            serde_json::from_str(r#"{"topic":"b","enqueued":3}"#).expect("read");
        assert_eq!(
            (old.enqueued, old.shed, old.discipline.as_str()),
            (3, 0, "")
        );
    }

    fn pool() -> pb::PoolEvents {
        pb::PoolEvents {
            hop: "b".into(),
            replicas: vec![
                pb::ReplicaCounts {
                    picks: 10,
                    ..Default::default()
                },
                pb::ReplicaCounts {
                    picks: 4,
                    transient_failures: 1,
                    failed_connects: 2,
                    ..Default::default()
                },
            ],
            events: vec![
                pb::EndpointEvent {
                    unix_ns: 4_000_000_000,
                    replica: 1,
                    kind: pb::EndpointEventKind::TransientFailure as i32,
                    reason: "connection ended".into(),
                },
                pb::EndpointEvent {
                    unix_ns: 7_500_000_000,
                    replica: 1,
                    kind: pb::EndpointEventKind::Ready as i32,
                    reason: String::new(),
                },
            ],
            dropped: 0,
        }
    }

    #[test]
    fn pool_events_land_on_the_measured_clock_with_their_counts() {
        // The measured clock's 0 at 1 s of wall time.
        let c = caller_endpoints("a/0", &pool(), |ns| ns as f64 / 1e9 - 1.0);
        assert_eq!(c.caller, "a/0");
        assert_eq!(c.replicas[1].failed_connects, 2);
        assert_eq!(c.events[0].kind, "transient_failure");
        assert!((c.events[0].at_s - 3.0).abs() < 1e-9);
        assert!((c.events[1].at_s - 6.5).abs() < 1e-9);
        assert!(c.eventful());

        let quiet = pb::PoolEvents {
            events: Vec::new(),
            replicas: vec![pb::ReplicaCounts {
                picks: 3,
                ..Default::default()
            }],
            ..pool()
        };
        assert!(!caller_endpoints("loadgen", &quiet, |_| 0.0).eventful());
    }

    #[test]
    fn the_terminal_line_sums_up_per_called_replica() {
        let a = caller_endpoints("a/0", &pool(), |ns| ns as f64 / 1e9 - 1.0);
        let mut b = a.clone();
        b.caller = "a/1".into();
        for e in &mut b.events {
            e.at_s += 0.01;
        }
        assert_eq!(
            crate::analysis::endpoints::describe(&[a, b]).as_deref(),
            Some("b r1 transient_failure x2 (3.00..3.01 s), ready x2 (6.50..6.51 s)")
        );
        assert_eq!(crate::analysis::endpoints::describe(&[]), None);
    }
}

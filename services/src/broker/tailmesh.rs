//! tailmesh's own broker as a pull backend: its producer is
//! [`BrokerClient`] (one SubmitStream per client), its worker session one
//! Work stream (`worker`), and its statistics the broker's Stats call; the
//! broker itself (`server`, `queue`) keeps the deadlines, credits and
//! redeliveries that the external brokers' workers keep by headers.
//!
//! Its worker for callers that serve only tailmesh's broker is
//! `backend::run_worker`.

use std::collections::HashMap;

use futures::{FutureExt, future::BoxFuture};
use tailmesh_proto::pb;

use super::{
    client::{BrokerClient, endpoint},
    pull::{BackendError, BrokerAt, PullBackend, SessionEnd, Shutdown, TaskHandler, WorkerSpec},
    wire::Deadline,
    worker::{self, KEEPALIVE_TIMEOUT, WorkerOptions},
};
use crate::{addr::PeerAddr, link::LinkCounts};

/// tailmesh's broker at one address: a producer's client, and how its
/// workers hold their streams.
#[derive(Debug)]
pub(crate) struct TailmeshBackend {
    at: BrokerAt,
    client: BrokerClient,
    /// The workers' keepalive ([`WorkerOptions::ping_after`]).
    options: WorkerOptions,
}

impl TailmeshBackend {
    /// The broker at `addr`, its producer's client `client`.
    pub(crate) fn new(addr: &PeerAddr, client: BrokerClient) -> Self {
        Self::with_options(addr, client, WorkerOptions::credits(1))
    }

    fn with_options(addr: &PeerAddr, client: BrokerClient, options: WorkerOptions) -> Self {
        TailmeshBackend {
            at: BrokerAt {
                name: "tailmesh broker",
                addr: addr.clone(),
            },
            client,
            options,
        }
    }

    /// The broker at `addr` for a worker held with `options`.
    pub(crate) fn worker(addr: &PeerAddr, options: WorkerOptions) -> Self {
        Self::with_options(addr, BrokerClient::connect_lazy(addr.clone()), options)
    }
}

impl PullBackend for TailmeshBackend {
    fn at(&self) -> &BrokerAt {
        &self.at
    }

    fn submit<'a>(
        &'a self,
        topic: &'a str,
        payload: Vec<u8>,
        trace: Option<crate::telemetry::SpanContext>,
        deadline: Option<Deadline>,
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        async move {
            self.client
                .submit_by(
                    topic,
                    payload,
                    HashMap::new(),
                    trace.as_ref().map(crate::telemetry::wire),
                    deadline,
                )
                .await
                .map(|reply| reply.payload)
                .map_err(BackendError::Answered)
        }
        .boxed()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.client.clone().close().boxed()
    }

    fn link_counts(&self) -> Option<LinkCounts> {
        Some(self.client.link_counts())
    }

    fn session<'a>(
        &'a self,
        spec: &'a WorkerSpec,
        handler: TaskHandler,
        shutdown: Shutdown,
    ) -> BoxFuture<'a, SessionEnd> {
        let endpoint = endpoint(&self.at.addr)
            .http2_keep_alive_interval(self.options.ping_after)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let hello = pb::Hello {
            topic: spec.topic.clone(),
            worker: spec.worker.clone(),
            credits: spec.credits,
        };
        async move { worker::session(&self.at, &endpoint, hello, handler, shutdown).await }.boxed()
    }

    fn stats<'a>(
        &'a self,
        _topics: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<pb::TopicStats>, BackendError>> {
        async move {
            let mut client = BrokerClient::connect(self.at.addr.clone())
                .await
                .map_err(|e| BackendError::unavailable(&self.at, "connect", e))?;
            client.stats(None).await.map_err(BackendError::Answered)
        }
        .boxed()
    }
}

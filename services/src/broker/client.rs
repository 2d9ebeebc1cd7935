//! The producer side: [`BrokerClient`] submits tasks and reads statistics.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tailmesh_proto::pb::{self, broker_client};
use tonic::{
    Status,
    transport::{Channel, Endpoint},
};

use super::error::BrokerError;
use crate::addr::PeerAddr;

/// Extra time the grpc-timeout header (and the local wait) get beyond the
/// task's own deadline, so the broker's precise DEADLINE_EXCEEDED answer,
/// which says where the time went, arrives before either safety net fires.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);
/// How long connecting to the broker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A producer's handle on the broker: a cheap `Clone` over one tonic
/// channel (HTTP/2 connection), so many tasks can share it concurrently.
#[derive(Clone, Debug)]
pub struct BrokerClient {
    inner: broker_client::BrokerClient<Channel>,
}

impl BrokerClient {
    /// Connects to the broker at `addr`.
    pub async fn connect(addr: impl Into<PeerAddr>) -> Result<Self, BrokerError> {
        let addr = addr.into();
        let channel = endpoint(&addr)
            .connect()
            .await
            .map_err(|source| BrokerError::Connect { addr, source })?;
        Ok(Self::from_channel(channel))
    }

    /// A client for the broker at `addr` that connects on first use, so a
    /// caller can be built before the broker answers.
    pub fn connect_lazy(addr: impl Into<PeerAddr>) -> Self {
        Self::from_channel(endpoint(&addr.into()).connect_lazy())
    }

    /// Wraps an existing channel (for callers that build their own, e.g.
    /// with a balancer or extra layers).
    pub fn from_channel(channel: Channel) -> Self {
        // The broker bounds what it sends (its max_payload_bytes); tonic's
        // 4 MiB default would refuse a full-size payload plus its framing.
        let inner = broker_client::BrokerClient::new(channel).max_decoding_message_size(usize::MAX);
        BrokerClient { inner }
    }

    /// Submits one task to `topic` and waits for the worker's answer.
    ///
    /// `deadline` is the time the caller is still willing to wait: the task
    /// carries it as an absolute deadline, the broker answers
    /// DEADLINE_EXCEEDED when it passes (and never dispatches a task whose
    /// deadline passed in the queue), and the call gives up locally
    /// shortly after it. Errors are the broker's statuses (see
    /// `broker.proto`) or the worker's own.
    pub async fn submit(
        &mut self,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        headers: HashMap<String, String>,
        deadline: Option<Duration>,
    ) -> Result<pb::SubmitReply, Status> {
        let deadline_unix_nanos = deadline.map_or(0, |d| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            u64::try_from((now + d).as_nanos()).unwrap_or(u64::MAX)
        });
        let mut request = tonic::Request::new(pb::SubmitRequest {
            topic: topic.to_owned(),
            payload: payload.into(),
            headers,
            deadline_unix_nanos,
        });
        let Some(deadline) = deadline else {
            return self
                .inner
                .submit(request)
                .await
                .map(tonic::Response::into_inner);
        };
        let patience = deadline + DEADLINE_SLACK;
        request.set_timeout(patience);
        crate::deadline::within(patience, self.inner.submit(request), || {
            format!("no answer from the broker (task deadline {deadline:?})")
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Per-topic statistics: one topic, or every topic when `topic` is
    /// `None`.
    pub async fn stats(&mut self, topic: Option<&str>) -> Result<Vec<pb::TopicStats>, Status> {
        let request = pb::StatsRequest {
            topic: topic.unwrap_or_default().to_owned(),
        };
        Ok(self.inner.stats(request).await?.into_inner().topics)
    }
}

/// The endpoint every broker client uses.
pub(crate) fn endpoint(addr: &PeerAddr) -> Endpoint {
    Endpoint::from(
        addr.uri()
            .parse::<tonic::codegen::http::Uri>()
            .expect("a checked host and port make a valid URI"),
    )
    .connect_timeout(CONNECT_TIMEOUT)
    .tcp_nodelay(true)
}

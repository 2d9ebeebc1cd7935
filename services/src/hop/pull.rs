//! Reaching a pulled hop ([`PullTarget`]): a call becomes a task on the
//! hop's broker topic (its name), submitted through tailmesh's broker,
//! RabbitMQ or NATS JetStream, with the trace context (binary through
//! tailmesh's broker, a `traceparent` header through the others); the
//! worker's reply comes back through the broker.

use std::{sync::Arc, time::Duration};

use prost::Message;
use tailmesh_proto::pb::{CallReply, CallRequest};
use tonic::Status;

use super::error::CallError;
use crate::{
    addr::PeerAddr,
    broker::backend::Producer,
    link::{LinkCounts, LinkEvents},
    model::{BrokerKind, Connection, QueueBounds},
    telemetry,
};

/// A hop reached through the broker: its topic is the hop's name.
#[derive(Clone)]
pub struct PullTarget {
    clients: Clients,
    kind: BrokerKind,
    bounds: QueueBounds,
    topic: String,
    broker: PeerAddr,
}

/// A pull target's broker clients.
#[derive(Clone)]
enum Clients {
    /// One client, shared by every call (and every clone of the target).
    Shared(Producer),
    /// A new client for every call, closed after it; the connections of
    /// tailmesh's broker's clients are all counted in `events`.
    PerRequest { events: Arc<LinkEvents> },
}

impl PullTarget {
    /// A target for `topic` on tailmesh's broker at `broker`; connects
    /// lazily.
    pub fn new(broker: impl Into<PeerAddr>, topic: &str) -> Self {
        Self::of_kind(BrokerKind::Tailmesh, QueueBounds::default(), broker, topic)
    }

    /// A target for `topic` on the `kind` broker at `broker`, whose queue
    /// an external broker holds within `bounds`; connects lazily.
    pub fn of_kind(
        kind: BrokerKind,
        bounds: QueueBounds,
        broker: impl Into<PeerAddr>,
        topic: &str,
    ) -> Self {
        let broker = broker.into();
        PullTarget {
            clients: Clients::Shared(Producer::connect_lazy(kind, &broker, bounds)),
            kind,
            bounds,
            topic: topic.to_string(),
            broker,
        }
    }

    /// The target with `connection`: [`Connection::PerRequest`] makes
    /// every call connect a broker client of its own and close it after
    /// the reply (RabbitMQ's with a 1 s heartbeat), as an RPC client that
    /// does not keep its connection would.
    pub fn with_connection(self, connection: Connection) -> Self {
        let clients = match (connection, self.clients) {
            (Connection::Shared, clients @ Clients::Shared(_)) => clients,
            (Connection::Shared, Clients::PerRequest { .. }) => {
                Clients::Shared(Producer::connect_lazy(self.kind, &self.broker, self.bounds))
            }
            (Connection::PerRequest, Clients::Shared(_)) => Clients::PerRequest {
                events: Arc::default(),
            },
            (Connection::PerRequest, clients @ Clients::PerRequest { .. }) => clients,
        };
        PullTarget { clients, ..self }
    }

    /// What happened to the connections to the broker so far, every
    /// per-call client's together (tailmesh's broker only; `None` through
    /// RabbitMQ or NATS).
    pub fn link_counts(&self) -> Option<LinkCounts> {
        match &self.clients {
            Clients::Shared(client) => client.link_counts(),
            Clients::PerRequest { events } => {
                (self.kind == BrokerKind::Tailmesh).then(|| events.counts())
            }
        }
    }

    /// Submits the request to the topic and decodes the worker's reply.
    /// Errors name the hop and the broker.
    pub async fn call(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let trace = telemetry::current();
        let payload = request.encode_to_vec();
        let reply = match &self.clients {
            Clients::Shared(client) => client.submit(&self.topic, payload, trace, timeout).await,
            Clients::PerRequest { events } => {
                // Closed however the call ends; a call dropped before its
                // end (a hedge that lost, a deadline) drops the client,
                // which closes its connection too.
                let client = Producer::per_call(self.kind, &self.broker, self.bounds, events);
                let reply = client.submit(&self.topic, payload, trace, timeout).await;
                client.close().await;
                reply
            }
        }
        .map_err(|status| CallError::ViaBroker {
            hop: self.topic.clone(),
            broker: self.broker.clone(),
            status,
        })?;
        let reply =
            CallReply::decode(reply.as_slice()).map_err(|source| CallError::UndecodableReply {
                hop: self.topic.clone(),
                broker: self.broker.clone(),
                source,
            })?;
        Ok(reply)
    }
}

//! Each external broker's own request/reply, with no queue a worker pulls
//! from: the baseline a pull hop through that broker is measured against.
//! - NATS: core request/reply (`Client::request` to a subscriber that
//!   publishes the payload back to the request's inbox);
//! - RabbitMQ: direct reply-to (publish to a queue a consumer reads with
//!   automatic acknowledgement, the reply published to
//!   `amq.rabbitmq.reply-to`), no publisher confirms.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use futures::StreamExt;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties,
    options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions},
    types::FieldTable,
};
use tailmesh_bench::{Call, CallError};
use tailmesh_services::{
    addr::PeerAddr,
    broker::rabbitmq::{self, DirectReplies},
    model::BrokerKind,
};
use tokio::sync::{oneshot, watch};

async fn nats(addr: &PeerAddr) -> Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .request_timeout(None)
        .connect(format!("nats://{addr}"))
        .await
        .with_context(|| format!("connect to nats-server at {addr}"))
}

async fn amqp(addr: &PeerAddr) -> Result<(Connection, Channel)> {
    let connection = Connection::connect(&rabbitmq::uri(addr), ConnectionProperties::default())
        .await
        .with_context(|| format!("connect to RabbitMQ at {addr}"))?;
    let channel = connection.create_channel().await.context("AMQP channel")?;
    Ok((connection, channel))
}

/// Echoes every request on `subject` (a NATS subject, or a RabbitMQ queue
/// it declares) until `stop`; `ready` fires once requests reach it.
pub(crate) async fn responder(
    kind: BrokerKind,
    addr: PeerAddr,
    subject: String,
    mut stop: watch::Receiver<bool>,
    ready: oneshot::Sender<()>,
) -> Result<()> {
    let mut stopped = std::pin::pin!(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    match kind {
        BrokerKind::Nats => {
            let client = nats(&addr).await?;
            let mut sub = client.subscribe(subject).await.context("NATS subscribe")?;
            client.flush().await.context("NATS flush")?;
            let _ = ready.send(());
            loop {
                tokio::select! {
                    () = &mut stopped => return Ok(()),
                    msg = sub.next() => {
                        let Some(msg) = msg else { bail!("NATS subscription ended") };
                        if let Some(reply) = msg.reply {
                            client.publish(reply, msg.payload).await.context("NATS publish")?;
                        }
                    }
                }
            }
        }
        BrokerKind::Rabbitmq => {
            let (connection, channel) = amqp(&addr).await?;
            channel
                .queue_declare(
                    subject.as_str().into(),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .context("declare the request queue")?;
            let mut requests = channel
                .basic_consume(
                    subject.as_str().into(),
                    "".into(),
                    BasicConsumeOptions {
                        no_ack: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .context("consume the request queue")?;
            let _ = ready.send(());
            loop {
                tokio::select! {
                    () = &mut stopped => break,
                    next = requests.next() => {
                        let Some(delivery) = next else { bail!("AMQP consumer ended") };
                        let delivery = delivery.context("AMQP delivery")?;
                        let Some(reply_to) = delivery.properties.reply_to().clone() else { continue };
                        let mut properties = BasicProperties::default();
                        if let Some(c) = delivery.properties.correlation_id().clone() {
                            properties = properties.with_correlation_id(c);
                        }
                        channel
                            .basic_publish("".into(), reply_to, BasicPublishOptions::default(), &delivery.data, properties)
                            .await
                            .context("AMQP reply")?;
                    }
                }
            }
            let _ = connection.close(200, "done".into()).await;
            Ok(())
        }
        BrokerKind::Tailmesh => bail!("tailmesh's broker has no core request/reply"),
    }
}

/// A requester over one connection: NATS core requests, or RabbitMQ
/// publishes answered by direct reply-to.
#[derive(Clone)]
pub(crate) enum Requester {
    Nats {
        client: async_nats::Client,
        subject: Arc<str>,
        payload: Bytes,
    },
    Rabbitmq {
        channel: Channel,
        queue: Arc<str>,
        payload: Arc<[u8]>,
        replies: Arc<DirectReplies>,
        /// Kept open for the requester's life.
        _connection: Arc<Connection>,
    },
}

impl Requester {
    pub(crate) async fn connect(
        kind: BrokerKind,
        addr: &PeerAddr,
        subject: &str,
        payload: &[u8],
    ) -> Result<Self> {
        match kind {
            BrokerKind::Nats => Ok(Requester::Nats {
                client: nats(addr).await?,
                subject: subject.into(),
                payload: Bytes::copy_from_slice(payload),
            }),
            BrokerKind::Rabbitmq => {
                let (connection, channel) = amqp(addr).await?;
                let replies = DirectReplies::consume(&channel)
                    .await
                    .context("consume direct reply-to")?;
                Ok(Requester::Rabbitmq {
                    channel,
                    queue: subject.into(),
                    payload: payload.into(),
                    replies: Arc::new(replies),
                    _connection: Arc::new(connection),
                })
            }
            BrokerKind::Tailmesh => bail!("tailmesh's broker has no core request/reply"),
        }
    }
}

impl Call for Requester {
    async fn call(&mut self) -> Result<(), CallError> {
        match self {
            Requester::Nats {
                client,
                subject,
                payload,
            } => {
                let reply = client.request(subject.to_string(), payload.clone()).await?;
                if reply.payload != *payload {
                    return Err("NATS echoed other bytes".into());
                }
            }
            Requester::Rabbitmq {
                channel,
                queue,
                payload,
                replies,
                ..
            } => {
                let (properties, pending) = replies.request();
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_ref().into(),
                        BasicPublishOptions::default(),
                        payload,
                        properties,
                    )
                    .await?;
                let reply = pending.received().await.ok_or("the reply consumer ended")?;
                if reply.data.as_slice() != payload.as_ref() {
                    return Err("RabbitMQ echoed other bytes".into());
                }
            }
        }
        Ok(())
    }
}

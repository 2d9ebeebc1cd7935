//! A leaf service reached directly ([`DirectTarget`]): `[hop.service]
//! direct = true` puts no sidecar in front of the service, so its caller
//! (the load generator, or the hop before it) sends the configured request
//! to the configured method itself, and measures the service's own
//! latency without tailmesh's forwarding in front of it.
//!
//! The service answers its own message, not a path, so the caller writes
//! the hop's record: the call's time, as the caller saw it, is the hop's
//! service and total time; its transport is `"direct"`. A service in
//! tailmesh's serving layers (`layers = true`, [`crate::serving`]) writes
//! its own: the caller sends the request's id, attempt and caller in its
//! `tm-*` metadata and takes the record from the reply's `tm-hop-bin`
//! header (a reply without one gets the caller's record, as above).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tailmesh_proto::pb::{CallReply, CallRequest, HopRecord};
use tokio::time::Instant;
use tonic::{Status, metadata::MetadataMap};

use super::service::{ServiceClient, ServiceError};
use crate::model::ServiceCall;

pub use tailmesh_model::DIRECT_TRANSPORT;

/// A directly reached service hop: resolved clients (channels), each
/// with its replica, taken in turn (round robin).
#[derive(Debug)]
pub struct DirectTarget {
    hop: Arc<str>,
    /// The caller's hop name (empty for the load generator).
    caller: String,
    clients: Vec<(u32, ServiceClient)>,
    next: AtomicUsize,
    /// The service runs tailmesh's serving layers.
    layered: bool,
}

impl DirectTarget {
    /// Resolves `call`'s method and request against each of `addresses`
    /// (replica `i` at index `i`), `channels` times each (a channel, one
    /// HTTP/2 connection, per client), waiting up to `patience` for a
    /// service that cannot be reached yet.
    pub async fn resolve(
        hop: &str,
        caller: &str,
        call: &ServiceCall,
        addresses: &[String],
        channels: usize,
        patience: Duration,
    ) -> Result<Self, ServiceError> {
        if addresses.is_empty() {
            return Err(ServiceError::Address {
                address: String::new(),
                reason: format!("hop \"{hop}\" has no replica to call"),
            });
        }
        let mut clients = Vec::with_capacity(addresses.len() * channels.max(1));
        for _ in 0..channels.max(1) {
            for (replica, address) in (0u32..).zip(addresses) {
                let call = ServiceCall {
                    address: address.clone(),
                    ..call.clone()
                };
                clients.push((replica, ServiceClient::resolve(&call, patience).await?));
            }
        }
        Ok(DirectTarget {
            hop: hop.into(),
            caller: caller.to_owned(),
            clients,
            next: AtomicUsize::new(0),
            layered: call.layered,
        })
    }

    /// The hop's name.
    pub fn hop(&self) -> &str {
        &self.hop
    }

    /// Calls the next replica's service with the configured request under
    /// `timeout`, and answers as a hop would: `request`'s id and payload,
    /// and the path of one record, this hop's, timed by the caller. The
    /// service's non-OK status is the call's.
    pub async fn call(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let (replica, client) =
            &self.clients[self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len()];
        let start = Instant::now();
        let own = if self.layered {
            let mut metadata = MetadataMap::new();
            super::metadata::insert_call_metadata(
                &mut metadata,
                request.request_id,
                request.attempt,
                &self.caller,
                request.caller_slow,
                request.branch,
            );
            let (headers, _) = client.call_with(timeout, metadata.into_headers()).await?;
            // Its caller reached it directly, whatever the layers say.
            super::metadata::record_of(&MetadataMap::from_headers(headers)).map(|own| HopRecord {
                transport: DIRECT_TRANSPORT.to_owned(),
                ..own
            })
        } else {
            client.call(timeout).await?;
            None
        };
        let took = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Ok(CallReply {
            request_id: request.request_id,
            payload: request.payload,
            path: vec![own.unwrap_or_else(|| HopRecord {
                hop: self.hop.to_string(),
                replica: *replica,
                service_ns: took,
                total_ns: took,
                parent: self.caller.clone(),
                transport: DIRECT_TRANSPORT.to_owned(),
                ..HopRecord::default()
            })],
            ..CallReply::default()
        })
    }
}

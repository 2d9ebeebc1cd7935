//! The readiness probe: one `grpc.health.v1.Health/Check` for the whole
//! server (service ""), as every supervised tailmesh process serves it
//! ([`Readiness::PROCESS`]); and its plaintext form for the gRPC services
//! of `[hop.service]`, which may have no health service at all
//! ([`Readiness::SERVICE`]).

use std::time::Duration;

use tailmesh_services::addr::PeerAddr;

use tonic::transport::Endpoint;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// Why one health check did not say SERVING.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No connection (refused, unresolvable, timed out).
    #[error("connect {addr}: {cause}")]
    Connect {
        addr: PeerAddr,
        /// Why, with its causes.
        cause: String,
    },
    /// The call failed.
    #[error("health check on {addr}: {code:?}: {message}")]
    Rpc {
        addr: PeerAddr,
        code: tonic::Code,
        message: String,
    },
    /// It answered, but not SERVING.
    #[error("health check on {addr}: {status}")]
    NotServing { addr: PeerAddr, status: String },
}

/// What a readiness probe asks of and accepts from one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Connect in plaintext whatever the run's links use, rather than with
    /// the process's client TLS when it has one.
    pub plaintext: bool,
    /// UNIMPLEMENTED counts as ready: the server has no health service, but
    /// it accepted the connection and answered a gRPC call.
    pub unimplemented_is_ready: bool,
}

impl Readiness {
    /// A tailmesh process: it serves health, over the run's TLS when the
    /// run's links use it.
    pub const PROCESS: Readiness = Readiness {
        plaintext: false,
        unimplemented_is_ready: false,
    };

    /// A gRPC service of `[hop.service]`: plaintext, and it may have no
    /// health service at all.
    pub const SERVICE: Readiness = Readiness {
        plaintext: true,
        unimplemented_is_ready: true,
    };
}

/// Asks `addr` once whether it is ready, as `readiness` says: ready when
/// it answers the server's health SERVING (or, where allowed,
/// UNIMPLEMENTED); `timeout` bounds the connection and the call, so a
/// process that accepts but never answers cannot stall the launcher past
/// its deadline.
pub async fn check(
    addr: &PeerAddr,
    timeout: Duration,
    readiness: Readiness,
) -> Result<(), ProbeError> {
    let uri = addr
        .uri()
        .parse::<tonic::transport::Uri>()
        .map_err(|e| ProbeError::Connect {
            addr: addr.clone(),
            cause: e.to_string(),
        })?;
    let endpoint = Endpoint::from(uri)
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = if readiness.plaintext {
        endpoint.connect().await
    } else {
        // TLS when the run's links use it (the process's client config).
        tailmesh_services::link::connect(&endpoint, &Default::default()).await
    }
    .map_err(|e| ProbeError::Connect {
        addr: addr.clone(),
        cause: crate::error_chain(&e),
    })?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    let response = match answer {
        Ok(response) => response,
        Err(status)
            if readiness.unimplemented_is_ready && status.code() == tonic::Code::Unimplemented =>
        {
            return Ok(());
        }
        Err(status) => {
            return Err(ProbeError::Rpc {
                addr: addr.clone(),
                code: status.code(),
                message: status.message().to_string(),
            });
        }
    };
    match ServingStatus::try_from(response.into_inner().status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(ProbeError::NotServing {
            addr: addr.clone(),
            status: other.as_str_name().to_string(),
        }),
        Err(unknown) => Err(ProbeError::NotServing {
            addr: addr.clone(),
            status: format!("unknown status {}", unknown.0),
        }),
    }
}

//! The readiness probe: one `grpc.health.v1.Health/Check` for the whole
//! server (service ""), as every supervised tailmesh process serves it;
//! and its plaintext form for the gRPC services of `[hop.service]`, which
//! may have no health service at all.

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

/// Asks `addr` once whether it is SERVING; `timeout` bounds the connection
/// and the call, so a process that accepts but never answers cannot stall
/// the launcher past its deadline.
pub async fn check(addr: &PeerAddr, timeout: Duration) -> Result<(), ProbeError> {
    let endpoint = Endpoint::from(addr.uri().parse::<tonic::transport::Uri>().map_err(|e| {
        ProbeError::Connect {
            addr: addr.clone(),
            cause: e.to_string(),
        }
    })?)
    .connect_timeout(timeout)
    .timeout(timeout);
    // TLS when the run's links use it (the process's client config).
    let channel = tailmesh_services::link::connect(&endpoint, &Default::default())
        .await
        .map_err(|e| ProbeError::Connect {
            addr: addr.clone(),
            cause: crate::error_chain(&e),
        })?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|status| ProbeError::Rpc {
            addr: addr.clone(),
            code: status.code(),
            message: status.message().to_string(),
        })?;
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

/// Asks a service of `[hop.service]` at `addr` once whether it is ready,
/// in plaintext whatever the run's links use: ready when it answers the
/// server's health SERVING, or UNIMPLEMENTED (it has no health service,
/// but it accepted the connection and answered a gRPC call).
pub async fn check_service(addr: &PeerAddr, timeout: Duration) -> Result<(), ProbeError> {
    let uri = addr
        .uri()
        .parse::<tonic::transport::Uri>()
        .map_err(|e| ProbeError::Connect {
            addr: addr.clone(),
            cause: e.to_string(),
        })?;
    let channel = Endpoint::from(uri)
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| ProbeError::Connect {
            addr: addr.clone(),
            cause: crate::error_chain(&e),
        })?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    match answer {
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(()),
        Err(status) => Err(ProbeError::Rpc {
            addr: addr.clone(),
            code: status.code(),
            message: status.message().to_string(),
        }),
        Ok(response) => match ServingStatus::try_from(response.into_inner().status) {
            Ok(ServingStatus::Serving) => Ok(()),
            Ok(other) => Err(ProbeError::NotServing {
                addr: addr.clone(),
                status: other.as_str_name().to_string(),
            }),
            Err(unknown) => Err(ProbeError::NotServing {
                addr: addr.clone(),
                status: format!("unknown status {}", unknown.0),
            }),
        },
    }
}

//! The readiness probe: one `grpc.health.v1.Health/Check` for the whole
//! server (service ""), as every supervised tailmesh process serves it.

use std::{error::Error as _, net::SocketAddr, time::Duration};

use tonic::transport::Endpoint;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// Why one health check did not say SERVING.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("connect {addr}: {cause}")]
    Connect { addr: SocketAddr, cause: String },
    #[error("health check on {addr}: {code:?}: {message}")]
    Rpc {
        addr: SocketAddr,
        code: tonic::Code,
        message: String,
    },
    #[error("health check on {addr}: {status}")]
    NotServing { addr: SocketAddr, status: String },
}

/// Asks `addr` once whether it is SERVING; `timeout` bounds the connection
/// and the call, so a process that accepts but never answers cannot stall
/// the launcher past its deadline.
pub(crate) async fn check(addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
    let endpoint = Endpoint::from(
        format!("http://{addr}")
            .parse::<tonic::transport::Uri>()
            .map_err(|e| ProbeError::Connect {
                addr,
                cause: e.to_string(),
            })?,
    )
    .connect_timeout(timeout)
    .timeout(timeout);
    let channel = endpoint.connect().await.map_err(|e| ProbeError::Connect {
        addr,
        cause: error_chain(&e),
    })?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|status| ProbeError::Rpc {
            addr,
            code: status.code(),
            message: status.message().to_string(),
        })?;
    match ServingStatus::try_from(response.into_inner().status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(ProbeError::NotServing {
            addr,
            status: other.as_str_name().to_string(),
        }),
        Err(unknown) => Err(ProbeError::NotServing {
            addr,
            status: format!("unknown status {}", unknown.0),
        }),
    }
}

/// tonic's transport errors say only "transport error" at the top; the
/// cause (connection refused, timed out) is further down the chain.
fn error_chain(error: &tonic::transport::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

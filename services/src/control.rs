//! The fault agent: `tailmesh.v1.Control` on every hop replica, which sets,
//! clears and reports the network faults of the replica's own namespace.
//!
//! Authentication: every call carries the run's token as `authorization:
//! Bearer <token>` metadata (the scheme in any case), compared in constant
//! time; without it the answer is UNAUTHENTICATED and nothing is touched.
//! Every value is validated before the backend sees it. How a fault is
//! applied (netem, nftables, the NFQUEUE delay line) is the backend's
//! business: `tailmesh-netfault` provides it, the tests provide a
//! recording one.

use std::{sync::Arc, time::Duration};

use tailmesh_proto::pb::{
    self, ClearFaultsRequest, FaultState, GetFaultsRequest, NetFault, SetFaultsRequest,
    control_server::{Control, ControlServer},
};

use crate::model::{DurationDist, Slowness};

/// Sets (`Some`) or removes (`None`) a replica's runtime slowness.
pub type SlownessSetter = Arc<dyn Fn(Option<Slowness>) + Send + Sync>;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

/// Largest delay the agent accepts.
pub const MAX_DELAY: Duration = Duration::from_secs(60);

// The backend contract lives with its implementations; re-exported so that
// a backend for this service needs this module only.
pub use tailmesh_netfault::{
    FaultError, FaultSpec,
    agent::{Applied, FaultBackend, NoFaults},
};

/// Checks a request's fault.
pub fn validate(net: Option<&NetFault>) -> Result<FaultSpec, Status> {
    let net = net.ok_or_else(|| Status::invalid_argument("net is required"))?;
    if !(0.0..=1.0).contains(&net.loss) || net.loss.is_nan() {
        return Err(Status::invalid_argument(format!(
            "net.loss must be between 0 and 1, got {}",
            net.loss
        )));
    }
    let delay = Duration::from_micros(net.delay_us);
    let jitter = Duration::from_micros(net.jitter_us);
    if delay > MAX_DELAY {
        return Err(Status::invalid_argument(format!(
            "net.delay_us must be at most {} (60 s), got {}",
            MAX_DELAY.as_micros(),
            net.delay_us
        )));
    }
    if jitter > delay {
        return Err(Status::invalid_argument(format!(
            "net.jitter_us ({}) must not exceed net.delay_us ({})",
            net.jitter_us, net.delay_us
        )));
    }
    Ok(FaultSpec {
        loss: net.loss,
        delay,
        jitter,
    })
}

/// Checks a request's slowness.
pub fn validate_slowness(slow: &pb::Slowness) -> Result<Slowness, Status> {
    if !(0.0..=1.0).contains(&slow.probability) || slow.probability.is_nan() {
        return Err(Status::invalid_argument(format!(
            "slow.probability must be between 0 and 1, got {}",
            slow.probability
        )));
    }
    let extra = Duration::from_micros(slow.extra_us);
    if extra > MAX_DELAY {
        return Err(Status::invalid_argument(format!(
            "slow.extra_us must be at most {} (60 s), got {}",
            MAX_DELAY.as_micros(),
            slow.extra_us
        )));
    }
    Ok(Slowness {
        probability: slow.probability,
        extra: DurationDist::Fixed { value: extra },
    })
}

/// The Control service over a backend, guarded by `token`.
pub struct ControlService<B> {
    token: Arc<str>,
    backend: Arc<B>,
    slowness: Option<SlownessSetter>,
    state: Mutex<FaultState>,
}

impl<B: FaultBackend> ControlService<B> {
    /// A service accepting `token` (non-empty).
    pub fn new(token: impl Into<Arc<str>>, backend: B) -> Self {
        Self {
            token: token.into(),
            backend: Arc::new(backend),
            slowness: None,
            state: Mutex::new(FaultState::default()),
        }
    }

    /// Lets the service change the replica's slowness through `setter`.
    pub fn with_slowness(mut self, setter: SlownessSetter) -> Self {
        self.slowness = Some(setter);
        self
    }

    /// The tonic server.
    pub fn into_server(self) -> ControlServer<Self> {
        ControlServer::new(self)
    }

    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .unwrap_or("");
        if self.token.is_empty() || !constant_time_eq(given.as_bytes(), self.token.as_bytes()) {
            return Err(Status::unauthenticated(
                "the Control API needs the run's token as `authorization: Bearer <token>`",
            ));
        }
        Ok(())
    }

    async fn blocking<F>(&self, f: F) -> Result<Applied, Status>
    where
        F: FnOnce(&B) -> Result<Applied, FaultError> + Send + 'static,
    {
        let backend = Arc::clone(&self.backend);
        tokio::task::spawn_blocking(move || f(&backend))
            .await
            .map_err(|_| Status::internal("the fault task failed"))?
            .map_err(|e| {
                tracing::warn!("fault agent: {e}");
                // The detail stays in the hop's log; callers learn the kind.
                Status::failed_precondition(format!("the fault could not be applied: {e}"))
            })
    }
}

/// The token of an `authorization` value in the Bearer scheme: the scheme
/// matched case-insensitively and any number of spaces after it, as RFC
/// 9110 section 11.1 and RFC 6750 section 2.1 allow.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("Bearer")
        .then(|| rest.trim_start_matches(' '))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[tonic::async_trait]
impl<B: FaultBackend> Control for ControlService<B> {
    async fn set_faults(
        &self,
        request: Request<SetFaultsRequest>,
    ) -> Result<Response<FaultState>, Status> {
        self.authorize(&request)?;
        let SetFaultsRequest { net, slow } = request.into_inner();
        if net.is_none() && slow.is_none() {
            return Err(Status::invalid_argument("set net, slow, or both"));
        }
        // Everything is validated before anything is changed.
        let spec = net.as_ref().map(|n| validate(Some(n))).transpose()?;
        let slowness = slow.as_ref().map(validate_slowness).transpose()?;
        if slowness.is_some() && self.slowness.is_none() {
            return Err(Status::failed_precondition(
                "this agent cannot change the replica's slowness",
            ));
        }
        let mut state = self.state.lock().await;
        if let Some(spec) = spec {
            let applied = self.blocking(move |b| b.apply(&spec)).await?;
            state.net = net;
            state.mechanisms = applied.mechanisms;
            state.packets_seen = 0;
            state.packets_dropped = 0;
        }
        if let (Some(slowness), Some(setter)) = (slowness, &self.slowness) {
            setter(Some(slowness));
            state.slow = slow;
        }
        Ok(Response::new(state.clone()))
    }

    async fn clear_faults(
        &self,
        request: Request<ClearFaultsRequest>,
    ) -> Result<Response<FaultState>, Status> {
        self.authorize(&request)?;
        let mut state = self.state.lock().await;
        if state.slow.take().is_some()
            && let Some(setter) = &self.slowness
        {
            setter(None);
        }
        if state.net.is_none() {
            return Ok(Response::new(FaultState::default()));
        }
        let applied = self.blocking(|b| b.clear()).await?;
        let [seen, dropped] = applied.packets.unwrap_or_default();
        let cleared = FaultState {
            net: None,
            mechanisms: std::mem::take(&mut state.mechanisms),
            packets_seen: seen,
            packets_dropped: dropped,
            slow: None,
        };
        *state = FaultState::default();
        Ok(Response::new(cleared))
    }

    async fn get_faults(
        &self,
        request: Request<GetFaultsRequest>,
    ) -> Result<Response<FaultState>, Status> {
        self.authorize(&request)?;
        Ok(Response::new(self.state.lock().await.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_in_any_case_with_any_spaces() {
        for value in [
            "Bearer t0k",
            "bearer t0k",
            "BEARER t0k",
            "bEaReR t0k",
            "Bearer    t0k",
        ] {
            assert_eq!(bearer_token(value), Some("t0k"), "{value:?}");
        }
    }

    #[test]
    fn other_schemes_and_malformed_values_carry_no_token() {
        for value in [
            "Basic t0k",
            "Bearert0k",
            "Bearer",
            "",
            "Bearer\tt0k",
            " Bearer t0k",
        ] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
        // Only the scheme is case-insensitive: the token is kept as sent.
        assert_eq!(bearer_token("bearer T0K"), Some("T0K"));
    }
}

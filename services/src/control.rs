//! The fault agent: `tailmesh.v1.Control` on every hop replica, which sets,
//! clears and reports the network faults of the replica's own namespace,
//! and the replica's application-level faults (slowness, a work factor,
//! injected errors), each kind on its own.
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
    self, ClearFaultsRequest, EndpointEvents, FaultKind, FaultState, GetEndpointEventsRequest,
    GetFaultsRequest, NetFault, SetFaultsRequest,
    control_server::{Control, ControlServer},
    dist,
};

use crate::model::{DurationDist, ErrorInjection, Overrides, Slowness};

/// Hands a replica the application-level faults now set at runtime (all of
/// them, every time one kind changes).
pub type BehaviorSetter = Arc<dyn Fn(Overrides) + Send + Sync>;

/// Reads what a replica's clients did with the replicas of the push hops it
/// calls (one entry per such hop).
pub type EndpointEventsSource = Arc<dyn Fn() -> Vec<pb::PoolEvents> + Send + Sync>;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

/// Most a work factor may multiply the work by, as `replica_slow.factor`.
pub const MAX_WORK_FACTOR: f64 = 1000.0;
/// Largest log-normal sigma, as a scenario's.
pub const MAX_SIGMA: f64 = 10.0;

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
    if let Some(follow) = slow.follow
        && !(0.0..=1.0).contains(&follow)
    {
        return Err(Status::invalid_argument(format!(
            "slow.follow must be between 0 and 1, got {follow}"
        )));
    }
    let extra = match &slow.extra {
        Some(dist) => validate_dist(dist)?,
        None => DurationDist::Fixed {
            value: micros("slow.extra_us", slow.extra_us)?,
        },
    };
    Ok(Slowness {
        probability: slow.probability,
        extra,
        follow: slow.follow,
    })
}

/// `us` microseconds as a duration, refused above [`MAX_DELAY`].
fn micros(field: &str, us: u64) -> Result<Duration, Status> {
    let d = Duration::from_micros(us);
    if d > MAX_DELAY {
        return Err(Status::invalid_argument(format!(
            "{field} must be at most {} (60 s), got {us}",
            MAX_DELAY.as_micros()
        )));
    }
    Ok(d)
}

/// Checks a distribution of durations.
fn validate_dist(d: &pb::Dist) -> Result<DurationDist, Status> {
    match &d.kind {
        None => Err(Status::invalid_argument("slow.extra needs a kind")),
        Some(dist::Kind::Fixed(f)) => Ok(DurationDist::Fixed {
            value: micros("slow.extra.fixed.value_us", f.value_us)?,
        }),
        Some(dist::Kind::Uniform(u)) => {
            let min = micros("slow.extra.uniform.min_us", u.min_us)?;
            let max = micros("slow.extra.uniform.max_us", u.max_us)?;
            if min > max {
                return Err(Status::invalid_argument(format!(
                    "slow.extra.uniform: min_us ({}) must not exceed max_us ({})",
                    u.min_us, u.max_us
                )));
            }
            Ok(DurationDist::Uniform { min, max })
        }
        Some(dist::Kind::Exp(e)) => Ok(DurationDist::Exp {
            mean: positive(
                micros("slow.extra.exp.mean_us", e.mean_us)?,
                "slow.extra.exp.mean_us",
            )?,
        }),
        Some(dist::Kind::Lognormal(l)) => {
            if !(l.sigma > 0.0 && l.sigma <= MAX_SIGMA) {
                return Err(Status::invalid_argument(format!(
                    "slow.extra.lognormal.sigma must be in (0, {MAX_SIGMA}], got {}",
                    l.sigma
                )));
            }
            Ok(DurationDist::Lognormal {
                mean: positive(
                    micros("slow.extra.lognormal.mean_us", l.mean_us)?,
                    "slow.extra.lognormal.mean_us",
                )?,
                sigma: l.sigma,
            })
        }
        Some(dist::Kind::Empirical(e)) => {
            if e.quantiles.len() != e.values_us.len() {
                return Err(Status::invalid_argument(format!(
                    "slow.extra.empirical: {} quantiles but {} values_us; one value per quantile",
                    e.quantiles.len(),
                    e.values_us.len()
                )));
            }
            let points = e
                .quantiles
                .iter()
                .zip(&e.values_us)
                .map(|(q, v)| Ok((*q, micros("slow.extra.empirical.values_us", *v)?)))
                .collect::<Result<Vec<_>, Status>>()?;
            DurationDist::empirical(points)
                .map_err(|e| Status::invalid_argument(format!("slow.extra.empirical: {e}")))
        }
    }
}

fn positive(d: Duration, field: &str) -> Result<Duration, Status> {
    if d.is_zero() {
        return Err(Status::invalid_argument(format!(
            "{field} must be greater than 0"
        )));
    }
    Ok(d)
}

/// Checks a request's work factor.
pub fn validate_work_factor(factor: f64) -> Result<f64, Status> {
    if !(1.0..=MAX_WORK_FACTOR).contains(&factor) {
        return Err(Status::invalid_argument(format!(
            "work_factor must be between 1 and {MAX_WORK_FACTOR}, got {factor}"
        )));
    }
    Ok(factor)
}

/// Checks a request's error injection.
pub fn validate_error(error: &pb::ErrorInjection) -> Result<ErrorInjection, Status> {
    if !(0.0..=1.0).contains(&error.probability) || error.probability.is_nan() {
        return Err(Status::invalid_argument(format!(
            "error.probability must be between 0 and 1, got {}",
            error.probability
        )));
    }
    if !(1..=16).contains(&error.code) {
        return Err(Status::invalid_argument(format!(
            "error.code must be a gRPC status code 1..=16, got {}",
            error.code
        )));
    }
    Ok(ErrorInjection {
        probability: error.probability,
        code: error.code,
    })
}

/// The message for a slowness (the inverse of [`validate_slowness`]).
pub fn slowness_message(slow: &Slowness) -> pb::Slowness {
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let kind = match &slow.extra {
        DurationDist::Fixed { value } => dist::Kind::Fixed(dist::Fixed {
            value_us: us(*value),
        }),
        DurationDist::Uniform { min, max } => dist::Kind::Uniform(dist::Uniform {
            min_us: us(*min),
            max_us: us(*max),
        }),
        DurationDist::Exp { mean } => dist::Kind::Exp(dist::Exp { mean_us: us(*mean) }),
        DurationDist::Lognormal { mean, sigma } => dist::Kind::Lognormal(dist::Lognormal {
            mean_us: us(*mean),
            sigma: *sigma,
        }),
        DurationDist::Empirical { quantiles } => dist::Kind::Empirical(dist::Empirical {
            quantiles: quantiles.iter().map(|(q, _)| *q).collect(),
            values_us: quantiles.iter().map(|(_, v)| us(*v)).collect(),
        }),
    };
    pb::Slowness {
        probability: slow.probability,
        extra_us: 0,
        extra: Some(pb::Dist { kind: Some(kind) }),
        follow: slow.follow,
    }
}

/// The message for an error injection.
pub fn error_message(error: &ErrorInjection) -> pb::ErrorInjection {
    pb::ErrorInjection {
        probability: error.probability,
        code: error.code,
    }
}

/// The Control service over a backend, guarded by `token`.
pub struct ControlService<B> {
    token: Arc<str>,
    backend: Arc<B>,
    behavior: Option<BehaviorSetter>,
    endpoint_events: Option<EndpointEventsSource>,
    state: Mutex<AgentState>,
}

/// What the agent has set: as reported, and as handed to the replica.
#[derive(Default)]
struct AgentState {
    reported: FaultState,
    overrides: Overrides,
}

impl<B: FaultBackend> ControlService<B> {
    /// A service accepting `token` (non-empty).
    pub fn new(token: impl Into<Arc<str>>, backend: B) -> Self {
        Self {
            token: token.into(),
            backend: Arc::new(backend),
            behavior: None,
            endpoint_events: None,
            state: Mutex::new(AgentState::default()),
        }
    }

    /// Lets the service change the replica's application-level faults
    /// (slowness, work factor, errors) through `setter`.
    pub fn with_behavior(mut self, setter: BehaviorSetter) -> Self {
        self.behavior = Some(setter);
        self
    }

    /// Lets `GetEndpointEvents` read the replica's downstream pools through
    /// `source` (without it, the answer lists no pool).
    pub fn with_endpoint_events(mut self, source: EndpointEventsSource) -> Self {
        self.endpoint_events = Some(source);
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
        let SetFaultsRequest {
            net,
            slow,
            work_factor,
            error,
        } = request.into_inner();
        if net.is_none() && slow.is_none() && work_factor.is_none() && error.is_none() {
            return Err(Status::invalid_argument(
                "set at least one of net, slow, work_factor and error",
            ));
        }
        // Everything is validated before anything is changed.
        let spec = net.as_ref().map(|n| validate(Some(n))).transpose()?;
        let slowness = slow.as_ref().map(validate_slowness).transpose()?;
        let factor = work_factor.map(validate_work_factor).transpose()?;
        let injection = error.as_ref().map(validate_error).transpose()?;
        let app = slowness.is_some() || factor.is_some() || injection.is_some();
        if app && self.behavior.is_none() {
            return Err(Status::failed_precondition(
                "this agent cannot change the replica's application-level faults",
            ));
        }
        let mut state = self.state.lock().await;
        if let Some(spec) = spec {
            let applied = self.blocking(move |b| b.apply(&spec)).await?;
            state.reported.net = net;
            state.reported.mechanisms = applied.mechanisms;
            state.reported.packets_seen = 0;
            state.reported.packets_dropped = 0;
        }
        if let Some(slowness) = slowness {
            state.overrides.slow = Some(slowness);
            state.reported.slow = slow;
        }
        if let Some(factor) = factor {
            state.overrides.work_factor = Some(factor);
            state.reported.work_factor = Some(factor);
        }
        if let Some(injection) = injection {
            state.overrides.error = Some(injection);
            state.reported.error = error;
        }
        if let (true, Some(setter)) = (app, &self.behavior) {
            setter(state.overrides.clone());
        }
        Ok(Response::new(state.reported.clone()))
    }

    async fn clear_faults(
        &self,
        request: Request<ClearFaultsRequest>,
    ) -> Result<Response<FaultState>, Status> {
        self.authorize(&request)?;
        let kinds = request.into_inner().kinds;
        let clears = |kind: FaultKind| {
            kinds.is_empty()
                || kinds
                    .iter()
                    .any(|k| *k == kind as i32 || *k == FaultKind::All as i32)
        };
        let mut state = self.state.lock().await;
        let before = state.overrides.clone();
        if clears(FaultKind::Slow) {
            state.overrides.slow = None;
            state.reported.slow = None;
        }
        if clears(FaultKind::WorkFactor) {
            state.overrides.work_factor = None;
            state.reported.work_factor = None;
        }
        if clears(FaultKind::Error) {
            state.overrides.error = None;
            state.reported.error = None;
        }
        if state.overrides != before
            && let Some(setter) = &self.behavior
        {
            setter(state.overrides.clone());
        }
        if !clears(FaultKind::Net) || state.reported.net.is_none() {
            return Ok(Response::new(state.reported.clone()));
        }
        let applied = self.blocking(|b| b.clear()).await?;
        let [seen, dropped] = applied.packets.unwrap_or_default();
        // The answer reports what the cleared network fault did, beside the
        // faults still set.
        let mechanisms = std::mem::take(&mut state.reported.mechanisms);
        state.reported.net = None;
        state.reported.packets_seen = 0;
        state.reported.packets_dropped = 0;
        Ok(Response::new(FaultState {
            mechanisms,
            packets_seen: seen,
            packets_dropped: dropped,
            ..state.reported.clone()
        }))
    }

    async fn get_faults(
        &self,
        request: Request<GetFaultsRequest>,
    ) -> Result<Response<FaultState>, Status> {
        self.authorize(&request)?;
        Ok(Response::new(self.state.lock().await.reported.clone()))
    }

    async fn get_endpoint_events(
        &self,
        request: Request<GetEndpointEventsRequest>,
    ) -> Result<Response<EndpointEvents>, Status> {
        self.authorize(&request)?;
        Ok(Response::new(EndpointEvents {
            pools: self
                .endpoint_events
                .as_ref()
                .map(|source| source())
                .unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        hop::{HopConfig, HopCore},
        model::{HopBehavior, Work},
    };
    use tailmesh_proto::pb::CallRequest;

    const TOKEN: &str = "t0k";

    fn authorized<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {TOKEN}").parse().expect("metadata"),
        );
        request
    }

    /// A replica whose work is a 2 ms sleep on tokio's clock (paused in
    /// the tests, so its service time is exact), with its Control service.
    fn replica() -> (HopCore, ControlService<NoFaults>) {
        let config = HopConfig {
            precise_timer: false,
            ..HopConfig::new(HopBehavior {
                work: Work::Sleep {
                    dist: DurationDist::Fixed {
                        value: Duration::from_millis(2),
                    },
                },
                ..HopBehavior::idle("x", 3)
            })
        };
        let core = HopCore::new(&config).expect("a hop without downstream");
        let control = ControlService::new(TOKEN, NoFaults).with_behavior(core.behavior_setter());
        (core, control)
    }

    /// The service time of request `id`, or its error code.
    async fn serve(core: &HopCore, id: u64) -> Result<Duration, tonic::Code> {
        let request = CallRequest {
            request_id: id,
            ..CallRequest::default()
        };
        match core.handle(request, None, Duration::ZERO, None).await {
            Ok(reply) => Ok(Duration::from_nanos(
                reply.path.first().expect("a path record").service_ns,
            )),
            Err(status) => Err(status.code()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_work_factor_and_error_injection_take_effect_and_clear() {
        let (core, control) = replica();
        let ms = Duration::from_millis;
        assert_eq!(serve(&core, 1).await, Ok(ms(2)));

        let state = control
            .set_faults(authorized(SetFaultsRequest {
                work_factor: Some(20.0),
                ..Default::default()
            }))
            .await
            .expect("set the work factor")
            .into_inner();
        assert_eq!(state.work_factor, Some(20.0));
        assert_eq!(serve(&core, 2).await, Ok(ms(40)));

        let state = control
            .set_faults(authorized(SetFaultsRequest {
                error: Some(pb::ErrorInjection {
                    probability: 1.0,
                    code: tonic::Code::Unavailable as i32,
                }),
                ..Default::default()
            }))
            .await
            .expect("set the error injection")
            .into_inner();
        assert_eq!(
            state.work_factor,
            Some(20.0),
            "setting one kind keeps the other"
        );
        assert_eq!(serve(&core, 3).await, Err(tonic::Code::Unavailable));

        let state = control
            .clear_faults(authorized(ClearFaultsRequest {
                kinds: vec![FaultKind::Error as i32],
            }))
            .await
            .expect("clear the errors")
            .into_inner();
        assert_eq!((state.error, state.work_factor), (None, Some(20.0)));
        assert_eq!(serve(&core, 4).await, Ok(ms(40)), "the factor stays");

        control
            .clear_faults(authorized(ClearFaultsRequest {
                kinds: vec![FaultKind::WorkFactor as i32],
            }))
            .await
            .expect("clear the work factor");
        assert_eq!(serve(&core, 5).await, Ok(ms(2)));
    }

    #[test]
    fn a_slowness_message_validates_back_to_itself() {
        let d = Duration::from_micros;
        for extra in [
            DurationDist::Fixed { value: d(1_500) },
            DurationDist::Uniform {
                min: d(1_000),
                max: d(3_000),
            },
            DurationDist::Exp { mean: d(2_000) },
            DurationDist::Lognormal {
                mean: d(2_000),
                sigma: 1.5,
            },
            DurationDist::Empirical {
                quantiles: vec![(0.0, d(500)), (0.9, d(2_000)), (1.0, d(9_000))],
            },
        ] {
            let slow = Slowness {
                probability: 0.25,
                extra,
                follow: Some(0.75),
            };
            assert_eq!(
                validate_slowness(&slowness_message(&slow)).expect("valid"),
                slow
            );
        }
        let mut follow_too_high = slowness_message(&Slowness {
            probability: 0.25,
            extra: DurationDist::Fixed { value: d(1_000) },
            follow: None,
        });
        assert_eq!(
            validate_slowness(&follow_too_high).expect("valid").follow,
            None
        );
        follow_too_high.follow = Some(1.5);
        let refused = validate_slowness(&follow_too_high).expect_err("out of range");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            refused.message(),
            "slow.follow must be between 0 and 1, got 1.5"
        );
        // Empirical quantiles are checked as a scenario's are.
        let empirical = |quantiles: Vec<f64>, values_us: Vec<u64>| pb::Slowness {
            probability: 0.5,
            extra_us: 0,
            extra: Some(pb::Dist {
                kind: Some(dist::Kind::Empirical(dist::Empirical {
                    quantiles,
                    values_us,
                })),
            }),
            follow: None,
        };
        for (message, why) in [
            (
                empirical(vec![0.0, 1.0], vec![5]),
                "slow.extra.empirical: 2 quantiles but 1 values_us; one value per quantile",
            ),
            (
                empirical(vec![0.0, 1.0], vec![5, 4]),
                "slow.extra.empirical: quantile 2 is below the one before it: higher quantiles need values at least as high",
            ),
            (
                empirical(vec![0.0, 1.0], vec![5, 61_000_000]),
                "slow.extra.empirical.values_us must be at most 60000000 (60 s), got 61000000",
            ),
        ] {
            let refused = validate_slowness(&message).expect_err(why);
            assert_eq!(refused.code(), tonic::Code::InvalidArgument);
            assert_eq!(refused.message(), why);
        }
    }

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

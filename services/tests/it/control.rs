//! The fault agent's Control API on loopback: refused without the run's
//! token, every value validated before the backend sees it.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tailmesh_proto::pb::{
    CallRequest, ClearFaultsRequest, Dist, ErrorInjection, FaultKind, GetFaultsRequest, NetFault,
    SetFaultsRequest, Slowness, control_client::ControlClient, control_server::ControlServer, dist,
};
use tailmesh_services::control::{Applied, ControlService, FaultBackend, FaultError, FaultSpec};
use tokio::net::TcpListener;
use tonic::{Code, Request, transport::Channel};

/// Records every call it gets.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<String>>>);

impl FaultBackend for Recording {
    fn apply(&self, fault: &FaultSpec) -> Result<Applied, FaultError> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("apply {fault:?}"));
        Ok(Applied {
            mechanisms: vec!["nftables_numgen".to_owned()],
            packets: None,
        })
    }
    fn clear(&self) -> Result<Applied, FaultError> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push("clear".to_owned());
        Ok(Applied {
            mechanisms: vec!["nftables_numgen".to_owned()],
            packets: Some([100, 20]),
        })
    }
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

async fn serve(backend: Recording) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service: ControlServer<_> = ControlService::new(TOKEN, backend).into_server();
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    addr
}

async fn client(addr: SocketAddr) -> ControlClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    ControlClient::new(channel)
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("metadata"),
    );
    request
}

fn loss(loss: f64) -> SetFaultsRequest {
    SetFaultsRequest {
        net: Some(NetFault {
            loss,
            delay_us: 0,
            jitter_us: 0,
        }),
        slow: None,
        ..Default::default()
    }
}

#[tokio::test]
async fn calls_without_the_token_are_unauthenticated_and_touch_nothing() {
    let backend = Recording::default();
    let addr = serve(backend.clone()).await;
    let mut c = client(addr).await;

    let e = c.set_faults(loss(0.1)).await.expect_err("no token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = c
        .set_faults(with_token(loss(0.1), "wrong"))
        .await
        .expect_err("wrong token");
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = c
        .clear_faults(ClearFaultsRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = c
        .get_faults(GetFaultsRequest {})
        .await
        .expect_err("no token");
    assert_eq!(e.code(), Code::Unauthenticated);
    let mut bare = Request::new(GetFaultsRequest {});
    bare.metadata_mut()
        .insert("authorization", TOKEN.parse().expect("metadata"));
    let e = c.get_faults(bare).await.expect_err("no Bearer scheme");
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(backend.0.lock().expect("lock").is_empty());

    // With the token: set, report, clear.
    let state = c
        .set_faults(with_token(loss(0.2), TOKEN))
        .await
        .expect("set")
        .into_inner();
    assert_eq!(state.mechanisms, ["nftables_numgen"]);
    let got = c
        .get_faults(with_token(GetFaultsRequest {}, TOKEN))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.net.map(|n| n.loss), Some(0.2));
    let cleared = c
        .clear_faults(with_token(ClearFaultsRequest::default(), TOKEN))
        .await
        .expect("clear")
        .into_inner();
    assert_eq!((cleared.packets_seen, cleared.packets_dropped), (100, 20));
    assert_eq!(backend.0.lock().expect("lock").len(), 2);
}

#[tokio::test]
async fn impossible_values_are_invalid_arguments() {
    let backend = Recording::default();
    let addr = serve(backend.clone()).await;
    let mut c = client(addr).await;
    let bad = [
        loss(1.5),
        loss(-0.1),
        loss(f64::NAN),
        SetFaultsRequest {
            net: None,
            slow: None,
            ..Default::default()
        },
        SetFaultsRequest {
            net: Some(NetFault {
                loss: 0.0,
                delay_us: 1_000,
                jitter_us: 2_000,
            }),
            slow: None,
            ..Default::default()
        },
        SetFaultsRequest {
            net: Some(NetFault {
                loss: 0.0,
                delay_us: 61_000_000,
                jitter_us: 0,
            }),
            slow: None,
            ..Default::default()
        },
        SetFaultsRequest {
            net: None,
            slow: Some(Slowness {
                probability: 2.0,
                extra_us: 1_000,
                extra: None,
                follow: None,
            }),
            ..Default::default()
        },
        slow_drawn_from(dist::Kind::Uniform(dist::Uniform {
            min_us: 2_000,
            max_us: 1_000,
        })),
        slow_drawn_from(dist::Kind::Lognormal(dist::Lognormal {
            mean_us: 1_000,
            sigma: 0.0,
        })),
        SetFaultsRequest {
            work_factor: Some(0.5),
            ..Default::default()
        },
        SetFaultsRequest {
            work_factor: Some(1001.0),
            ..Default::default()
        },
        SetFaultsRequest {
            error: Some(ErrorInjection {
                probability: 0.1,
                code: 0,
            }),
            ..Default::default()
        },
        SetFaultsRequest {
            error: Some(ErrorInjection {
                probability: 1.1,
                code: 14,
            }),
            ..Default::default()
        },
    ];
    for request in bad {
        let e = c
            .set_faults(with_token(request.clone(), TOKEN))
            .await
            .expect_err("invalid");
        assert_eq!(e.code(), Code::InvalidArgument, "{request:?}: {e:?}");
    }
    assert!(backend.0.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn slowness_set_at_runtime_slows_every_request_until_cleared() {
    use tailmesh_proto::pb::hop_client::HopClient;

    let (addr, stop, server) = hop_with_control().await;
    let mut control = client(addr).await;
    let mut hop_client = HopClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let mut call = async |id: u64| {
        hop_client
            .call(CallRequest {
                request_id: id,
                ..CallRequest::default()
            })
            .await
            .expect("call")
            .into_inner()
            .path
            .first()
            .map(|r| (r.slow, r.service_ns))
            .expect("a path record")
    };
    assert!(!call(1).await.0, "no slowness before");

    let state = control
        .set_faults(with_token(
            SetFaultsRequest {
                net: None,
                slow: Some(Slowness {
                    probability: 1.0,
                    extra_us: 20_000,
                    extra: None,
                    follow: None,
                }),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .expect("set slowness")
        .into_inner();
    assert_eq!(state.slow.map(|s| s.extra_us), Some(20_000));
    let (slow, service_ns) = call(2).await;
    assert!(slow && service_ns >= 20_000_000, "{slow} {service_ns}");
    // A network fault is refused on a hop without a namespace of its own,
    // and the slowness stays.
    let e = control
        .set_faults(with_token(loss(0.1), TOKEN))
        .await
        .expect_err("no namespace");
    assert_eq!(e.code(), Code::FailedPrecondition);

    control
        .clear_faults(with_token(ClearFaultsRequest::default(), TOKEN))
        .await
        .expect("clear");
    assert!(!call(3).await.0, "slowness cleared");
    let _ = stop.send(());
    let _ = server.await;
}

/// A hop replica that does no work with a Control service over
/// [`NoFaults`] on loopback; stopped when the returned sender is dropped or
/// sent to.
async fn hop_with_control() -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tailmesh_services::hop::HopError>>,
) {
    use tailmesh_services::{
        control::NoFaults,
        hop::{self, HopConfig},
        model::HopBehavior,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = HopConfig {
        drain_grace: Duration::from_secs(1),
        ..HopConfig::new(HopBehavior::idle("x", 3))
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hop::run_with_control(
        config,
        listener,
        async {
            let _ = stopped.await;
        },
        Some(ControlService::new(TOKEN, NoFaults)),
    ));
    (addr, stop, server)
}

/// Calls the hop at `addr` once: whether its path record says it was
/// slowed.
async fn call_hop(addr: SocketAddr, id: u64) -> Result<bool, Code> {
    let mut hop = tailmesh_proto::pb::hop_client::HopClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    match hop
        .call(CallRequest {
            request_id: id,
            ..CallRequest::default()
        })
        .await
    {
        Ok(reply) => Ok(reply
            .into_inner()
            .path
            .first()
            .map(|r| r.slow)
            .expect("a path record")),
        Err(status) => Err(status.code()),
    }
}

fn clear(kinds: &[FaultKind]) -> Request<ClearFaultsRequest> {
    with_token(
        ClearFaultsRequest {
            kinds: kinds.iter().map(|k| *k as i32).collect(),
        },
        TOKEN,
    )
}

#[tokio::test]
async fn clearing_one_kind_keeps_the_others() {
    let (addr, stop, server) = hop_with_control().await;
    let mut control = client(addr).await;
    let slow = Slowness {
        probability: 1.0,
        extra_us: 0,
        extra: Some(Dist {
            kind: Some(dist::Kind::Uniform(dist::Uniform {
                min_us: 1_000,
                max_us: 3_000,
            })),
        }),
        follow: None,
    };
    let set = control
        .set_faults(with_token(
            SetFaultsRequest {
                slow: Some(slow.clone()),
                work_factor: Some(3.0),
                error: Some(ErrorInjection {
                    probability: 0.0,
                    code: 14,
                }),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .expect("set three kinds")
        .into_inner();
    assert_eq!(set.slow.as_ref(), Some(&slow));
    assert!(call_hop(addr, 1).await.expect("answered"), "slowed");

    let state = control
        .clear_faults(clear(&[FaultKind::WorkFactor, FaultKind::Error]))
        .await
        .expect("clear two kinds")
        .into_inner();
    assert_eq!(
        (state.slow.as_ref(), state.work_factor, state.error),
        (Some(&slow), None, None)
    );
    let got = control
        .get_faults(with_token(GetFaultsRequest {}, TOKEN))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got, state);
    assert!(
        call_hop(addr, 2).await.expect("answered"),
        "the slowness stays"
    );
    // Clearing the network (none is set) leaves the slowness too.
    control
        .clear_faults(clear(&[FaultKind::Net]))
        .await
        .expect("clear the network");
    assert!(call_hop(addr, 3).await.expect("answered"));

    let state = control
        .clear_faults(clear(&[]))
        .await
        .expect("clear everything")
        .into_inner();
    assert_eq!(state, tailmesh_proto::pb::FaultState::default());
    assert!(!call_hop(addr, 4).await.expect("answered"), "cleared");
    let _ = stop.send(());
    let _ = server.await;
}

/// Slowness for half the requests, its extra time drawn from `kind`.
fn slow_drawn_from(kind: dist::Kind) -> SetFaultsRequest {
    SetFaultsRequest {
        slow: Some(Slowness {
            probability: 0.5,
            extra_us: 0,
            extra: Some(Dist { kind: Some(kind) }),
            follow: None,
        }),
        ..Default::default()
    }
}

//! The echo inside tailmesh's serving layers, in-process on loopback: a
//! tonic client reads the hop's record from the reply, and faults set
//! through the Control service show in it.

use std::time::Duration;

use tailmesh_example_echo::{
    Echo, SERVER,
    pb::{EchoRequest, echo_client::EchoClient},
    run,
};
use tailmesh_proto::pb::{self, HopRecord, control_client::ControlClient};
use tailmesh_services::{
    hop::HopConfig,
    model::HopBehavior,
    serving::{self, HopLayers},
};
use tokio::{net::TcpListener, sync::oneshot, time::Instant};
use tonic::{Code, Request, transport::Channel};

const TOKEN: &str = "test-token";
const WORK: Duration = Duration::from_millis(5);

/// Serves the echo (sleeping `WORK` per call) on 127.0.0.1:0, layered as
/// replica 0 of hop "echo" or plain; a channel to it, and its stop.
async fn start(layered: bool) -> (Channel, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    let layers = layered.then(|| HopLayers::new(&HopConfig::new(HopBehavior::idle("echo", 1))));
    let echo = Echo {
        default_work: WORK,
        sleep: true,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(run(echo, layers, Some(TOKEN.to_owned()), listener, async {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    (channel, stop)
}

/// One echo call as hop "edge" makes it (request `id`, `work_us` of work
/// asked; 0: the server's): the reply's server and the hop's record, or
/// the status.
async fn call_with(
    channel: &Channel,
    id: u64,
    work_us: u32,
) -> Result<(String, Option<HopRecord>), tonic::Status> {
    let mut request = Request::new(EchoRequest {
        message: "hi".to_owned(),
        work_us,
        ..EchoRequest::default()
    });
    request.set_timeout(Duration::from_secs(5));
    serving::insert_call_metadata(request.metadata_mut(), id, 0, "edge", false, 0);
    let response = EchoClient::new(channel.clone()).echo(request).await?;
    let record = serving::record_of(response.metadata());
    Ok((response.into_inner().server, record))
}

async fn call(channel: &Channel, id: u64) -> Result<(String, Option<HopRecord>), tonic::Status> {
    call_with(channel, id, 0).await
}

fn authorized<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {TOKEN}").parse().expect("token"),
    );
    request
}

#[tokio::test]
async fn the_layered_echo_answers_with_the_hops_record_and_its_faults() {
    let (channel, _stop) = start(true).await;
    let ms = |n: u64| Duration::from_millis(n).as_nanos() as u64;

    let (server, record) = call(&channel, 1).await.expect("an echo");
    assert_eq!(server, SERVER);
    let record = record.expect("the hop's record in the reply");
    assert_eq!(
        (record.hop.as_str(), record.replica, record.parent.as_str()),
        ("echo", 0, "edge")
    );
    assert_eq!((record.transport.as_str(), record.slow), ("push", false));
    assert!(
        record.service_ns >= ms(5),
        "service {} ns",
        record.service_ns
    );
    assert!(record.total_ns >= record.service_ns);

    // Slowness through Control: 20 ms after the service's answer.
    let mut control = ControlClient::new(channel.clone());
    control
        .set_faults(authorized(pb::SetFaultsRequest {
            slow: Some(pb::Slowness {
                probability: 1.0,
                extra_us: 20_000,
                ..pb::Slowness::default()
            }),
            ..pb::SetFaultsRequest::default()
        }))
        .await
        .expect("set the slowness");
    let (_, record) = call(&channel, 2).await.expect("an echo");
    let record = record.expect("the hop's record");
    assert!(record.slow);
    assert!(
        record.service_ns >= ms(25),
        "service {} ns",
        record.service_ns
    );

    // An injected error answers at once, without the service's work (a
    // second, asked for, would show).
    control
        .set_faults(authorized(pb::SetFaultsRequest {
            error: Some(pb::ErrorInjection {
                probability: 1.0,
                code: Code::Unavailable as i32,
            }),
            ..pb::SetFaultsRequest::default()
        }))
        .await
        .expect("set the errors");
    let start = Instant::now();
    let status = call_with(&channel, 3, 1_000_000)
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        status,
        Some((
            Code::Unavailable,
            "injected error at hop \"echo\" replica 0".to_owned()
        ))
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "answered in {:?}",
        start.elapsed()
    );

    // Cleared, the echo answers as before.
    control
        .clear_faults(authorized(pb::ClearFaultsRequest::default()))
        .await
        .expect("clear the faults");
    let (_, record) = call(&channel, 4).await.expect("an echo");
    assert_eq!(record.map(|r| r.slow), Some(false));
}

#[tokio::test]
async fn the_plain_echo_sends_no_record() {
    let (channel, _stop) = start(false).await;
    let (server, record) = call(&channel, 1).await.expect("an echo");
    assert_eq!((server.as_str(), record), (SERVER, None));
}

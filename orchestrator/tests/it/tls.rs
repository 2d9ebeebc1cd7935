//! `[mesh] tls` end to end: a chain run under mutual TLS with a new
//! connection per request answers and accounts for every request, traces
//! them as plaintext does and counts its handshakes; and a hop serving TLS
//! refuses a plaintext HTTP/2 client while it serves one that speaks TLS.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use crate::support::*;
use serde_json::Value;
use tailmesh_services::{
    hop::HopConfig,
    model::HopBehavior,
    tls::{Authority, TlsFiles},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

tests! {
    sync an_mtls_chain_with_a_connection_per_request_answers_traces_and_counts_handshakes,
    sync a_tls_hop_refuses_plaintext_http2_and_serves_it_over_tls,
}

/// a -> b, a new connection from the load generator for every request,
/// plaintext, mTLS, and mTLS without session resumption.
const CHAIN: &str = r#"
name = "mtls"
seed = 4
[load]
mode = "open"
rate = 100
requests = 40
timeout = "2s"
connection = "per_request"
[mesh]
tls = "mtls"
[[hop]]
name = "a"
downstream = ["b"]
[[hop]]
name = "b"
work = { kind = "sleep", dist = "fixed", value = "200us" }
[[variant]]
name = "plain"
set = { "mesh.tls" = "off" }
[[variant]]
name = "mtls"
[[variant]]
name = "mtls-full"
set = { "mesh.tls_resumption" = false }
"#;
const REQUESTS: u64 = 40;

fn links(v: &Value, key: &str) -> u64 {
    u64_at(v, &format!("/generator_links/{key}"))
}

fn an_mtls_chain_with_a_connection_per_request_answers_traces_and_counts_handshakes() {
    let scratch = Scratch::shared();
    let scenario = write(scratch.path(), "mtls.toml", CHAIN);
    let (finished, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let summary = summary(&run_dir);
    let context = finished.output();
    let variants = variants(&summary);
    assert_eq!(variants.len(), 3, "{context}");
    for v in variants {
        let name = str_at(v, "/name");
        assert_accounted(v, &context);
        assert_eq!(
            u64_at(v, "/ok"),
            REQUESTS,
            "variant {name}: all ok\n{context}"
        );
        // A new connection per request (and per warmup request).
        assert!(
            links(v, "opened") >= REQUESTS,
            "variant {name}: {v:#}\n{context}"
        );
        // Hop a's calls to b, read from a's Control service (over TLS in
        // the TLS variants).
        let a_to_b = v["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["caller"] == "a/0" && c["hop"] == "b")
            .unwrap_or_else(|| panic!("variant {name}: no endpoints of a/0\n{context}"));
        assert!(
            u64_at(a_to_b, "/replicas/0/picks") >= REQUESTS,
            "variant {name}: {a_to_b:#}"
        );
    }
    assert!(!context.contains("endpoint events of"), "{context}");
    let [plain, mtls, full] = [&variants[0], &variants[1], &variants[2]];
    assert_eq!(links(plain, "tls_full") + links(plain, "tls_resumed"), 0);
    // Every connection of a TLS variant had a handshake, and with
    // resumption on most resume: only connections opened before a session
    // ticket was at hand (the readiness probe's, calls that overlap it)
    // are full.
    assert_eq!(
        links(mtls, "tls_full") + links(mtls, "tls_resumed"),
        links(mtls, "opened"),
        "{mtls:#}"
    );
    assert!(
        links(mtls, "tls_resumed") * 2 >= links(mtls, "opened"),
        "{mtls:#}"
    );
    assert_eq!(links(full, "tls_full"), links(full, "opened"), "{full:#}");
    assert_eq!(links(full, "tls_resumed"), 0, "{full:#}");

    // The run's CA and each process's certificate and private key.
    let tls = run_dir.join("tls").join("mtls");
    assert!(tls.join("ca.crt").is_file());
    for process in ["hop-a-0", "hop-b-0"] {
        assert!(tls.join(format!("{process}.crt")).is_file(), "{process}");
        let key = tls.join(format!("{process}.key"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&key).expect("a key file").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", key.display());
    }

    // Traces as in plaintext: one per request, every one as whole.
    let rows = requests_csv(&run_dir);
    assert_eq!(rows.len() as u64, 3 * REQUESTS);
    assert!(rows.iter().all(|r| r.status == "ok"), "{rows:?}");
    let traces = jaeger_traces(&run_dir);
    assert_eq!(traces.len() as u64, 3 * REQUESTS, "one trace per request");
    let spans: Vec<usize> = traces
        .iter()
        .map(|t| t["spans"].as_array().expect("spans").len())
        .collect();
    assert!(spans[0] >= 4, "load generator, a, a -> b, b: {spans:?}");
    assert!(spans.iter().all(|&n| n == spans[0]), "{spans:?}");
}

/// The HTTP/2 client preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Whether `answer` opens with an HTTP/2 SETTINGS frame (type 4).
fn is_settings(answer: &[u8]) -> bool {
    answer.len() >= 9 && answer[3] == 0x04
}

fn a_tls_hop_refuses_plaintext_http2_and_serves_it_over_tls() {
    let scratch = Scratch::new();
    let dir = scratch.path();
    let ca = Authority::new("test CA").expect("a CA");
    let names = ["127.0.0.1".to_owned()];
    let files: TlsFiles = ca
        .write_files(dir, "hop-a-0", &names, true, true)
        .expect("the hop's certificate");
    let config = HopConfig {
        drain_grace: Duration::from_secs(1),
        precise_timer: false,
        tls: Some(files),
        ..HopConfig::new(HopBehavior::idle("a", 7))
    };
    let config_path = dir.join("a.json");
    std::fs::write(
        &config_path,
        serde_json::to_string_pretty(&config).expect("a hop config serializes"),
    )
    .expect("write the hop config");
    let addr_file = dir.join("a.addr");
    let mut hop = Running::start(
        dir,
        &[
            "hop",
            "--config",
            path_str(&config_path),
            "--listen",
            "127.0.0.1:0",
            "--addr-file",
            path_str(&addr_file),
        ],
    );
    let addr = hop.wait_for("the hop's address file", || {
        std::fs::read_to_string(&addr_file)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    });

    assert_refuses_plaintext_http2(&addr);
    // The same preface over TLS with the client's certificate (mtls): the
    // hop answers as an HTTP/2 server.
    let client = ca
        .client_config("test client", true, true)
        .expect("a client config");
    assert_serves_http2_over_tls(&addr, client, "127.0.0.1");
    drop(hop);
}

/// Plaintext HTTP/2 to `addr`: the server ends the connection (with a TLS
/// alert or without a word) instead of answering with its SETTINGS.
pub(crate) fn assert_refuses_plaintext_http2(addr: &str) {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    tcp.write_all(PREFACE).expect("write the preface");
    let started = Instant::now();
    let mut answer = Vec::new();
    let ended = loop {
        let mut buf = [0u8; 256];
        match tcp.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("{addr}: no end of the connection within 10 s: {e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10));
    };
    assert!(ended);
    assert!(
        !is_settings(&answer),
        "{addr} answered plaintext: {answer:?}"
    );
    assert!(
        answer.is_empty() || answer[0] == 0x15,
        "{addr}: a TLS alert or nothing: {answer:?}"
    );
}

/// The HTTP/2 preface over TLS to `addr`, verifying the server's
/// certificate for `name` with `client`: the server answers with its
/// SETTINGS.
pub(crate) fn assert_serves_http2_over_tls(
    addr: &str,
    client: std::sync::Arc<rustls::ClientConfig>,
    name: &str,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let answer = runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut tls, _) = tailmesh_services::tls::connect(tcp, client, name)
            .await
            .unwrap_or_else(|e| panic!("a TLS handshake with {addr} as {name}: {e}"));
        tls.write_all(PREFACE).await.expect("write the preface");
        let mut answer = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut answer))
            .await
            .expect("an answer within 10 s")
            .expect("read the answer");
        answer
    });
    assert!(is_settings(&answer), "{addr}: {answer:?}");
}

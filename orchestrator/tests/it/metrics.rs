//! Live Prometheus metrics (`tailmesh run --metrics`): a real Prometheus
//! (Debian's, with native histograms) scrapes a run every second; once the
//! run has written its results, Prometheus' own API must give the counts
//! of summary.json and, from the native histogram, a p99 within one
//! bucket of the run's. Without the `prometheus` binary the test skips
//! (a failure under `TAILMESH_REQUIRE_ALL`).

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{harness::skip, support::*};

tests! {
    sync prometheus_scraping_a_run_sees_the_summarys_counts_and_its_p99_within_a_bucket,
}

/// A native bucket's width: bounds grow by 2^(1/8).
const BUCKET: f64 = 1.090_507_732_665_257_7;

/// A Prometheus server of the test's, killed (by its PID) when dropped.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port on the loopback, as the kernel hands one out.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("its address").port()
}

impl Prometheus {
    /// Starts `prometheus` scraping `target` every second, its data in
    /// `dir`, listening on a loopback port of its own.
    fn start(dir: &Path, target: &str) -> Prometheus {
        let config = write(
            dir,
            "prometheus.yml",
            &format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
                 - job_name: tailmesh\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        );
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("its log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", path_str(&config)))
            .arg(format!(
                "--storage.tsdb.path={}",
                path_str(&dir.join("tsdb"))
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--enable-feature=native-histograms")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus { child, addr }
    }

    /// The result of the instant query `query`, or `None` while it has
    /// none (or Prometheus is not answering yet).
    fn query(&self, query: &str) -> Option<Vec<Value>> {
        let body = http_get(
            &self.addr,
            &format!("/api/v1/query?query={}", encode(query)),
        )?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let result = v["data"]["result"].as_array()?.clone();
        (!result.is_empty()).then_some(result)
    }

    /// The one number `query` gives.
    fn number(&self, query: &str) -> Option<f64> {
        let result = self.query(query)?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }
}

/// Percent-encodes a query string's value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn prometheus_scraping_a_run_sees_the_summarys_counts_and_its_p99_within_a_bucket() {
    if !std::process::Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        skip("needs prometheus (Debian package prometheus)");
    }
    // It judges counts, and a p99 against the same run's: beside others.
    let _shared = shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(
        dir.path(),
        "live.toml",
        "name = \"live\"\nseed = 3\n[load]\nmode = \"open\"\nrate = 300\nduration = \"6s\"\n\
         warmup = \"500ms\"\n\
         [[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"exp\", mean = \"1ms\" }\n\
         error = { probability = 0.02, code = \"unavailable\" }\n[[hop]]\nname = \"b\"\n\
         [telemetry]\nsampling = 0.0\nmetrics_grace = \"10s\"\n",
    );
    let results = dir.path().join("results");
    let mut run = Running::start(
        dir.path(),
        &run_args(&scenario, &results, &["--metrics", "127.0.0.1:0"]),
    );
    let target = metrics_address(&mut run);
    // The text format, as an older server reads it: classic buckets.
    let text = run.wait_for("a scrape with the variant's series", || {
        http_get(&target, "/metrics")
            .filter(|t| t.contains("tailmesh_latency_seconds_bucket{run=\""))
    });
    assert!(
        text.contains("# TYPE tailmesh_latency_seconds histogram")
            && text.contains("variant=\"base\",le=\"+Inf\"}"),
        "{text}"
    );
    let prometheus = Prometheus::start(dir.path(), &target);
    // Once the results are written, the metrics stay for their grace.
    run.wait_for_output("the final counts stay at");
    let summary = summary(&only_run_dir(&results));
    let v = &variants(&summary)[0];
    let (sent, ok) = (u64_at(v, "/sent"), u64_at(v, "/ok"));
    let failed = sent - ok;
    assert!(failed > 0, "the injected errors: {v:#}");
    // Prometheus' last scrape has the final counts within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(8);
    let counts = |outcome: &str| {
        prometheus.number(&format!(
            "sum(tailmesh_requests_total{{variant=\"base\",outcome=\"{outcome}\"}})"
        ))
    };
    let seen = wait_until(
        deadline,
        later(|| {
            format!(
                "Prometheus never had the final counts (ok {ok}, sent {sent}): ok {:?}, sent {:?}; \
                 its log:\n{}",
                counts("ok"),
                prometheus.number("tailmesh_requests_sent_total"),
                read_lossy(&dir.path().join("prometheus.log"))
            )
        }),
        || {
            let seen_ok = counts("ok")?;
            let seen_sent = prometheus.number("tailmesh_requests_sent_total")?;
            (seen_ok == ok as f64 && seen_sent == sent as f64).then_some((seen_ok, seen_sent))
        },
    );
    let errors = prometheus
        .number("sum(tailmesh_requests_total{variant=\"base\",outcome!=\"ok\"})")
        .expect("the failed requests' count");
    assert_eq!(errors, failed as f64, "{v:#}");
    // The native histogram's p99 against the run's own.
    let p99 = prometheus
        .number("histogram_quantile(0.99, tailmesh_latency_seconds{variant=\"base\"})")
        .expect("a p99 from the native histogram");
    let run_p99 = u64_at(v, "/latency/p99_us") as f64 / 1e6;
    let native_count = prometheus
        .number("histogram_count(tailmesh_latency_seconds{variant=\"base\"})")
        .expect("the native histogram's count");
    eprintln!(
        "Prometheus: ok {} sent {} failed {errors}, native count {native_count}, p99 {:.3} ms \
         against the run's {:.3} ms",
        seen.0,
        seen.1,
        p99 * 1e3,
        run_p99 * 1e3
    );
    assert_eq!(
        native_count, ok as f64,
        "the native histogram holds every ok request"
    );
    assert!(
        p99 <= run_p99 * BUCKET && p99 >= run_p99 / BUCKET,
        "Prometheus p99 {p99} s, the run's {run_p99} s: more than a bucket apart"
    );
    let finished = run.wait();
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
}

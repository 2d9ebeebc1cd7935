//! A call-graph file written from known parameters, imported: the
//! parameters come back within their sampling error. The mesh:
//!
//! ```text
//! gateway ─┬─ (1.0)              auth ── (0.3) tokens
//!          └─ then, side by side: cart (0.6)
//!                                 stock (1.0, called 1 to 3 times, one after another)
//! ```
//!
//! Own times are lognormal with medians of 20 to 60 ms, far above the
//! format's millisecond resolution; every caller waits 1 ms more than its
//! callee serves (the network).

use std::collections::BTreeMap;
use std::fmt::Write;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use tailmesh_import::{Format, Mesh, read};

const TRACES: usize = 3000;

struct Writer {
    rng: ChaCha8Rng,
    rows: String,
    /// The own times drawn, per service, in ms.
    drawn: BTreeMap<&'static str, Vec<f64>>,
    trace: usize,
}

impl Writer {
    fn own(&mut self, service: &'static str) -> f64 {
        let median: f64 = match service {
            "gateway" => 20.0,
            "auth" => 30.0,
            "tokens" => 25.0,
            "cart" => 60.0,
            _ => 40.0,
        };
        let own = LogNormal::new(median.ln(), 0.5)
            .expect("valid lognormal")
            .sample(&mut self.rng);
        self.drawn.entry(service).or_default().push(own);
        own
    }

    /// Serves `service` from `start` (ms) as call `rpc` from `caller`;
    /// returns when it ended.
    fn serve(&mut self, rpc: &str, caller: &str, service: &'static str, start: f64) -> f64 {
        let own = self.own(service);
        let mut t = start + own / 2.0;
        match service {
            "gateway" => {
                t = self.call(&format!("{rpc}.1"), service, "auth", t);
                let mut ends = vec![];
                let mut next = 2;
                if self.rng.random_bool(0.6) {
                    ends.push(self.call(&format!("{rpc}.{next}"), service, "cart", t));
                    next += 1;
                }
                let times = self.rng.random_range(1..=3);
                let mut s = t;
                for _ in 0..times {
                    s = self.call(&format!("{rpc}.{next}"), service, "stock", s);
                    next += 1;
                }
                ends.push(s);
                t = ends.into_iter().fold(t, f64::max);
            }
            "auth" if self.rng.random_bool(0.3) => {
                t = self.call(&format!("{rpc}.1"), service, "tokens", t);
            }
            _ => {}
        }
        let end = t + own / 2.0;
        self.row(rpc, caller, service, start, -(end - start));
        end
    }

    /// A call from `caller` to `callee` at `at`; returns when the caller
    /// has the answer.
    fn call(&mut self, rpc: &str, caller: &'static str, callee: &'static str, at: f64) -> f64 {
        let served_until = self.serve(rpc, caller, callee, at + 0.5);
        let back = served_until + 0.5;
        self.row(rpc, caller, callee, at, back - at);
        back
    }

    fn row(&mut self, rpc: &str, um: &str, dm: &str, at: f64, rt: f64) {
        let pod = self.trace % 2;
        writeln!(
            self.rows,
            "{at:.0},T_{},S_1,{rpc},{um},{um}_POD_{pod},rpc,if,{dm},{dm}_POD_{pod},{rt:.0}",
            self.trace
        )
        .expect("writes to a string");
    }
}

fn sample() -> (String, BTreeMap<&'static str, Vec<f64>>) {
    let mut w = Writer {
        rng: ChaCha8Rng::seed_from_u64(7),
        rows: "timestamp,traceid,service,rpc_id,um,uminstanceid,rpctype,interface,dm,dminstanceid,rt\n".into(),
        drawn: BTreeMap::new(),
        trace: 0,
    };
    for trace in 0..TRACES {
        w.trace = trace;
        let start = trace as f64 * 1000.0;
        let end = w.serve("0.1", "USER", "gateway", start);
        w.row("0.1", "USER", "gateway", start, end - start);
    }
    (w.rows, w.drawn)
}

/// Kolmogorov-Smirnov distance between two samples.
fn ks(a: &[f64], b: &[f64]) -> f64 {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    d
}

/// `got` is within three standard errors of a share `p` over `n` trials.
fn share_close(got: f64, p: f64, n: u64) -> bool {
    (got - p).abs() <= 3.0 * (p * (1.0 - p) / n as f64).sqrt()
}

#[test]
fn the_parameters_a_sample_was_written_from_come_back() {
    let (csv, drawn) = sample();
    let imported = read(Format::Alibaba, "sample.csv", csv.as_bytes()).expect("imports");
    let r = &imported.repairs;
    assert_eq!(r.traces_read, TRACES as u64);
    assert_eq!(
        (r.inconsistent, r.rootless_traces, r.duplicates),
        (0, 0, 0),
        "{r:?}"
    );
    let mesh = Mesh::from_traces(&imported.traces);

    let names: Vec<&str> = mesh.services.keys().map(String::as_str).collect();
    assert_eq!(names, ["auth", "cart", "gateway", "stock", "tokens"]);
    assert_eq!(mesh.entries.len(), 1);
    assert_eq!(mesh.services["gateway"].instances.len(), 2);

    let gateways = mesh.services["gateway"].invocations;
    let auths = mesh.services["auth"].invocations;
    assert_eq!(gateways, TRACES as u64);
    assert_eq!(mesh.call_share("gateway", "auth"), 1.0);
    assert_eq!(mesh.call_share("gateway", "stock"), 1.0);
    let cart = mesh.call_share("gateway", "cart");
    assert!(share_close(cart, 0.6, gateways), "cart share {cart}");
    let tokens = mesh.call_share("auth", "tokens");
    assert!(share_close(tokens, 0.3, auths), "tokens share {tokens}");
    let stock = &mesh.edges[&("gateway".to_string(), "stock".to_string())];
    for n in 1..=3 {
        let got = stock.per_invocation[&n] as f64 / gateways as f64;
        assert!(
            share_close(got, 1.0 / 3.0, gateways),
            "stock {n} times: {got}"
        );
    }
    assert_eq!(
        mesh.stages("gateway"),
        [
            vec!["auth".to_string()],
            vec!["cart".to_string(), "stock".to_string()]
        ]
    );

    // Own times: the import's against the drawn ones, at the format's
    // millisecond resolution.
    for (service, want) in &drawn {
        let got: Vec<f64> = mesh.services[*service]
            .own_times
            .iter()
            .map(|&ns| ns as f64 / 1e6)
            .collect();
        assert_eq!(got.len(), want.len(), "{service}");
        let d = ks(&got, want);
        assert!(d < 0.05, "{service}: KS distance {d:.3}");
    }
}

#[test]
fn ks_distance_tells_different_samples_apart() {
    let a: Vec<f64> = (0..1000).map(f64::from).collect();
    let b: Vec<f64> = (500..1500).map(f64::from).collect();
    assert!(ks(&a, &a) < 1e-9);
    assert!((ks(&a, &b) - 0.5).abs() < 0.01);
}

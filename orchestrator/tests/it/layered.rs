//! A user's own tonic server in tailmesh's serving layers as a hop
//! (`[hop.service] layers = true`): the shipped scenario
//! (`scenarios/layered-echo.toml`, scaled down) with the example echo
//! server (examples/tonic-echo, which `cargo test --workspace` builds),
//! and a windowed fault set through the service's own Control API.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::*;

tests! {
    sync the_shipped_layered_echo_runs_as_a_hop_with_its_own_records,
}

/// The example echo server beside this test binary (`target/<profile>/`),
/// or a skip that says how to build it.
fn echo_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let built = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("tailmesh-echo"));
    match built {
        Some(path) if path.is_file() => path,
        _ => crate::harness::skip(
            "the example echo server is not built: cargo build -p tailmesh-example-echo (cargo \
             test --workspace builds it)",
        ),
    }
}

/// The example echo servers whose environment names `needle` (a path
/// inside this test's scratch folder).
fn echoes_naming(needle: &str) -> Vec<u32> {
    pids_where(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        runs_ours(pid, "tailmesh-echo") && String::from_utf8_lossy(&environ).contains(needle)
    })
}

fn the_shipped_layered_echo_runs_as_a_hop_with_its_own_records() {
    let echo = echo_binary();
    // It judges counts and files, not latency: it shares the machine.
    let scratch = Scratch::shared();
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/layered-echo.toml"
    ))
    .expect("read the shipped layered-echo scenario");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers/echo.proto");
    // The echo hop fails every call for a window, set through each
    // replica's own Control API (its faults are the layers').
    let scaled = shipped
        .replace(
            "\"cargo\", \"run\", \"--quiet\", \"--release\", \"--package\", \
             \"tailmesh-example-echo\", \"--\", ",
            &format!("{:?}, ", echo.display().to_string()),
        )
        .replace("duration = \"5s\"", "duration = \"2s\"")
        .replace("warmup = \"1s\"", "warmup = \"200ms\"")
        .replace(
            "\"../examples/servers/echo.proto\"",
            &format!("{:?}", proto.display().to_string()),
        )
        .replace(
            "concurrency = 8\n",
            "concurrency = 8\nerror = { probability = 1.0, code = \"unavailable\", start = \
             \"500ms\", duration = \"300ms\" }\n",
        )
        .replace(
            "compounding = true\n",
            "compounding = true\nmax_error_rate = 1.0\n",
        );
    assert!(
        !scaled.contains("\"cargo\"")
            && scaled.contains("duration = \"2s\"")
            && scaled.contains("warmup = \"200ms\"")
            && !scaled.contains("\"../examples/")
            && scaled.contains("error = {")
            && scaled.contains("max_error_rate"),
        "the scenario's command, load keys or paths changed: update this test\n{scaled}"
    );
    // As a user runs it: the scenario in a folder of its own (where its
    // service runs), the results relative to the current one.
    let folder = scratch.path().join("scenarios");
    std::fs::create_dir(&folder).expect("a scenario folder");
    let path = write(&folder, "layered-echo.toml", &scaled);
    let results = Path::new("results");
    let out = tailmesh_in(scratch.path(), &run_args(&path, results, &[]));
    let accounted = accounted(out, &scratch.path().join(results));
    let (v, context) = (&accounted.v, &accounted.context);
    let ok = u64_at(v, "/ok");
    assert!(ok > 0, "{context}");
    // The window's errors, answered by the layers without calling the
    // service.
    assert!(ok < u64_at(v, "/sent"), "{context}");

    // The echo hop's records are the service's own, from its layers (a
    // caller's own record could not know the injected slowness): both
    // replicas, every ok request, reached directly.
    let echo_hop = hop(v, "echo");
    assert_eq!(str_at(echo_hop, "/transport"), "direct", "{context}");
    assert_eq!(u64_at(echo_hop, "/requests"), ok, "{context}");
    let split = replica_requests(echo_hop);
    assert_eq!(split.len(), 2, "{context}");
    assert!(split.iter().all(|&n| n > 0), "{context}");
    assert!(u64_at(echo_hop, "/slow") > 0, "{context}");
    assert!(u64_at(echo_hop, "/service/min_us") >= 250, "{context}");
    assert_eq!(echo_hop["grpc_service"]["layers"], Value::Bool(true));
    assert_eq!(echo_hop["grpc_service"]["direct"], Value::Bool(true));

    // The window's fault reached each replica's Control API and was lifted.
    let incidents = v["incidents"].as_array().cloned().unwrap_or_default();
    assert!(incidents.is_empty(), "{context}");
    let windows = v["fault_windows"].as_array().expect("fault windows");
    assert_eq!(windows.len(), 2, "one per replica: {context}");
    for window in windows {
        assert_eq!(window["hop"], "echo", "{context}");
        assert!(window["applied_at_s"].is_f64(), "{context}");
        assert!(window["cleared_at_s"].is_f64(), "{context}");
    }

    // The compounding check saw every ok request.
    let compounding = v.pointer("/compounding").expect("compounding requested");
    assert!(u64_at(compounding, "/n") >= ok, "{context}");

    // Each replica: its service, its hop configuration, no sidecar.
    let logs = accounted.run_dir.join("logs").join("base");
    for replica in 0..2 {
        for (file, wanted) in [
            (format!("hop-echo-{replica}.service.log"), true),
            (format!("hop-echo-{replica}.json"), true),
            (format!("hop-echo-{replica}.log"), false),
        ] {
            assert_eq!(logs.join(&file).exists(), wanted, "{file}: {context}");
        }
    }
    let left = echoes_naming(&scratch.path().display().to_string());
    assert!(left.is_empty(), "left running: {left:?}\n{context}");
}

//! Compiles the .proto files with protox (pure Rust: no `protoc` needed on
//! any machine) and generates tonic clients and servers from them.

use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/tailmesh/v1/hop.proto",
        "proto/tailmesh/v1/broker.proto",
        "proto/tailmesh/v1/control.proto",
        "proto/tailmesh/v1/traces.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("tailmesh_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        // A hop request's payload is shared, not copied, by everyone who
        // holds the request: the load generator's calls in flight, a hop's
        // retries and hedges, a reply that echoes it.
        .bytes(".tailmesh.v1.CallRequest.payload")
        .bytes(".tailmesh.v1.CallReply.payload")
        // Broker statistics land in summary.json as they are.
        .type_attribute(
            ".tailmesh.v1.TopicStats",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        // Summaries written before a field existed still read.
        .type_attribute(".tailmesh.v1.TopicStats", "#[serde(default)]")
        .compile_fds(fds)?;
    Ok(())
}

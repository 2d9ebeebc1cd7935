//! tailmesh's gRPC protocol: generated code for `tailmesh.v1`, nothing else.
//!
//! - [`pb`]: messages, `Hop`, `Broker`, `Control` and `TraceDecisions`
//!   clients and servers.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for server reflection.

/// Generated code for the `tailmesh.v1` package.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("tailmesh.v1");
}

/// The encoded `FileDescriptorSet` of every tailmesh .proto file.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tailmesh_descriptor");

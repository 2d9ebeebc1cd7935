//! Server reflection that lists the services a process serves, and only
//! those: the descriptors of every tailmesh service are compiled into one
//! set, and listing them all made a hop advertise `tailmesh.v1.Broker`,
//! which answers UNIMPLEMENTED there.

use tonic_reflection::server::{
    Builder, Error,
    v1::{ServerReflection, ServerReflectionServer},
};

/// The reflection service (v1) for a server that serves the services named
/// in `served` (their gRPC names, e.g. `hop_server::SERVICE_NAME`) beside
/// gRPC health and reflection itself, which it lists too.
pub(crate) fn reflection_service(
    served: &[&str],
) -> Result<ServerReflectionServer<impl ServerReflection>, Error> {
    let builder = Builder::configure()
        .register_encoded_file_descriptor_set(tailmesh_proto::FILE_DESCRIPTOR_SET)
        // Health's descriptors, so a client can describe what is listed.
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(tonic_health::pb::health_server::SERVICE_NAME)
        .with_service_name(tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME);
    served
        .iter()
        .fold(builder, |builder, name| builder.with_service_name(*name))
        .build_v1()
}

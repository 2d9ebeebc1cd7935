//! The `tm-*` metadata a calling hop and a service in tailmesh's serving
//! layers ([`super::serving`]) exchange: the request's id, attempt and
//! caller one way, the hop's own record the other.

use prost::Message;

/// The request id, in decimal.
pub const REQUEST_ID_HEADER: &str = "tm-request-id";
/// The caller's attempt number (0 for the first), in decimal.
pub const ATTEMPT_HEADER: &str = "tm-attempt";
/// The calling hop's name.
pub const CALLER_HEADER: &str = "tm-caller";
/// "1" when the caller slowed this request with its injected slowness.
pub const CALLER_SLOW_HEADER: &str = "tm-caller-slow";
/// Which visit of the request to the hop this is (`CallRequest`'s
/// `branch`), in decimal; absent for the first.
pub const BRANCH_HEADER: &str = "tm-branch";
/// The hop's own record of the call, a protobuf `HopRecord` (a binary
/// metadata header: base64 on the wire).
pub const RECORD_HEADER: &str = "tm-hop-bin";

/// Sets the metadata of a call to a layered service as a calling hop
/// sends it: request `request_id`, attempt `attempt`, from hop `caller`,
/// which slowed it when `caller_slow`. A caller name that is not a valid
/// metadata value is left out (the record's parent is then empty).
pub fn insert_call_metadata(
    metadata: &mut tonic::metadata::MetadataMap,
    request_id: u64,
    attempt: u32,
    caller: &str,
    caller_slow: bool,
    branch: u64,
) {
    let number = |n: u64| -> tonic::metadata::AsciiMetadataValue {
        tonic::metadata::AsciiMetadataValue::from(n)
    };
    metadata.insert(REQUEST_ID_HEADER, number(request_id));
    metadata.insert(ATTEMPT_HEADER, number(u64::from(attempt)));
    if let Ok(caller) = caller.parse() {
        metadata.insert(CALLER_HEADER, caller);
    }
    if caller_slow {
        metadata.insert(CALLER_SLOW_HEADER, number(1));
    }
    if branch != 0 {
        metadata.insert(BRANCH_HEADER, number(branch));
    }
}

/// The hop's record in a reply's metadata, if it carries one (for a
/// caller of a layered service).
pub fn record_of(metadata: &tonic::metadata::MetadataMap) -> Option<tailmesh_proto::pb::HopRecord> {
    let bytes = metadata.get_bin(RECORD_HEADER)?.to_bytes().ok()?;
    tailmesh_proto::pb::HopRecord::decode(bytes).ok()
}

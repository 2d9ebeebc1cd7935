//! analysis and outputs. The binary in `main.rs` is a thin shell over this.
//!
//! - `scenario`: parse, validate and model scenario files.
//! - `record`: what was measured for each request.
//! - `roles`: `tailmesh hop` and the other service roles of the one binary.

pub mod record;
pub mod roles;
pub mod scenario;

//! The tailmesh command line.
fn main() {}

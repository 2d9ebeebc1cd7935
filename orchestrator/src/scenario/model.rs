//! The checked scenario lives in `tailmesh-model` (plain data the analysis
//! reads too); this module keeps its old path and what needs the
//! orchestrator's other crates.

pub use tailmesh_model::scenario::*;

/// What `fault` does to each packet, without its timing.
pub fn fault_spec(fault: &NetFault) -> tailmesh_netfault::FaultSpec {
    tailmesh_netfault::FaultSpec {
        loss: fault.loss,
        delay: fault.delay,
        jitter: fault.jitter,
    }
}

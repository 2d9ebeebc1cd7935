//! [`FaultRecord`]: one applied fault as a run reports it.

use std::time::Duration;

pub use tailmesh_model::fault::{FaultRecord, WindowRecord};

/// Milliseconds of a duration, for records.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

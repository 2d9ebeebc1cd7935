//! The order a queue serves its waiting requests in, as plain data: the
//! name a scenario gives it and the constants of `adaptive`. The queues
//! that follow it are `tailmesh_services::discipline`'s.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

/// How long a queue must have been non-empty before `adaptive` switches to
/// LIFO and shedding (Fail at Scale's N).
pub const ADAPTIVE_INTERVAL: Duration = Duration::from_millis(100);

/// The longest wait `adaptive` lets a request have once the queue stands
/// (Fail at Scale's M); longer waits are shed. Fail at Scale used 5 ms for
/// its services; a target near one service time leaves the worker idle
/// whenever no request arrived within it (at 1.5x a 5 ms worker's capacity,
/// 5 ms kept goodput at 0.6 of capacity through the broker), so this one is
/// a few service times of tailmesh's overload scenarios: 20 ms.
pub const ADAPTIVE_TARGET: Duration = Duration::from_millis(20);

/// The order a queue serves its waiting requests in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Discipline {
    /// Oldest first.
    #[default]
    Fifo,
    /// Newest first.
    Lifo,
    /// FIFO normally; newest first, shedding waits above
    /// [`ADAPTIVE_TARGET`], once the queue has not been empty for
    /// [`ADAPTIVE_INTERVAL`].
    Adaptive,
}

impl Discipline {
    /// Every discipline, in documentation order.
    pub const ALL: [Discipline; 3] = [Discipline::Fifo, Discipline::Lifo, Discipline::Adaptive];

    /// The name used in scenarios, flags and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Discipline::Fifo => "fifo",
            Discipline::Lifo => "lifo",
            Discipline::Adaptive => "adaptive",
        }
    }
}

impl fmt::Display for Discipline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a discipline.
#[derive(Debug)]
pub struct UnknownDiscipline(String);

impl fmt::Display for UnknownDiscipline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown queue discipline {:?} (expected fifo, lifo or adaptive)",
            self.0
        )
    }
}

impl std::error::Error for UnknownDiscipline {}

impl FromStr for Discipline {
    type Err = UnknownDiscipline;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Discipline::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| UnknownDiscipline(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Discipline::ALL {
            assert_eq!(d.as_str().parse::<Discipline>().ok(), Some(d));
        }
        assert!("random".parse::<Discipline>().is_err());
        assert_eq!(Discipline::default(), Discipline::Fifo);
    }
}

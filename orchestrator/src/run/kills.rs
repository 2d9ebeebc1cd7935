//! The kill schedule of a variant: each hop's `kill = { replica, at, back }`
//! carried out by the launcher, which SIGKILLs the replica's process by its
//! process id at `at` and, with `back`, starts it again from the same spec
//! at the same address `back` later, so its callers can reconnect.
//!
//! Times are on the measured clock like fault windows (see `faults`): a
//! kill at `at` happens `warmup + at` after the load's origin. A scheduled
//! death is not an incident: the launcher does not report the child it
//! killed as exited, and summary.json lists it under `kills`.

use std::time::Duration;

use tokio::time::Instant;

use crate::{
    analysis::KillRecord,
    launcher::{AnyLauncher, Killed},
    loadgen::LoadClock,
    plan::MeshPlan,
    scenario::Kill,
};

/// The kills of a variant, pending and done.
pub(super) struct Kills {
    planned: Vec<PlannedKill>,
    incidents: Vec<String>,
}

struct PlannedKill {
    process: String,
    hop: String,
    replica: u32,
    kill: Kill,
    /// When it is killed, and restarted, from the load's origin.
    kill_at: Duration,
    back_at: Option<Duration>,
    /// When it was killed, and what it was started from.
    killed: Option<(Instant, Killed)>,
    /// When it answered health checks again.
    restarted: Option<Instant>,
    /// Nothing more to do (restarted, failed, or staying dead).
    over: bool,
}

impl Kills {
    /// The kills of `plan`'s hops.
    pub(super) fn plan(plan: &MeshPlan) -> Self {
        let warmup = plan.variant.load.warmup;
        let planned = plan
            .hops()
            .filter_map(|(process, hop, replica)| {
                let kill = hop.kill.filter(|k| k.replica == replica)?;
                Some(PlannedKill {
                    process: process.name.clone(),
                    hop: hop.name.clone(),
                    replica,
                    kill,
                    kill_at: warmup + kill.at,
                    back_at: kill.back.map(|b| warmup + kill.at + b),
                    killed: None,
                    restarted: None,
                    over: false,
                })
            })
            .collect();
        Kills {
            planned,
            incidents: Vec::new(),
        }
    }

    /// When, from the load's origin, the schedule next kills or restarts a
    /// replica; `None` when nothing is left to do.
    pub(super) fn next_change(&self) -> Option<Duration> {
        self.planned
            .iter()
            .filter(|k| !k.over)
            .filter_map(|k| match k.killed {
                None => Some(k.kill_at),
                Some(_) => k.back_at,
            })
            .min()
    }

    /// Kills and restarts what is due `since_origin` from the load's
    /// origin, through `launcher`.
    pub(super) async fn advance(&mut self, since_origin: Duration, launcher: &mut AnyLauncher) {
        for k in self.planned.iter_mut().filter(|k| !k.over) {
            if k.killed.is_none() && k.kill_at <= since_origin {
                match launcher.kill(&k.process).await {
                    Ok(killed) => {
                        tracing::info!(process = %k.process, "killed as scheduled");
                        k.killed = Some((Instant::now(), killed));
                        k.over = k.back_at.is_none();
                    }
                    Err(e) => {
                        let line = format!(
                            "hop \"{}\" replica {}: scheduled kill not carried out: {e}",
                            k.hop, k.replica
                        );
                        crate::tell!("warning: {line}");
                        self.incidents.push(line);
                        k.over = true;
                    }
                }
            } else if let Some((_, killed)) = &k.killed
                && k.back_at.is_some_and(|at| at <= since_origin)
            {
                k.over = true;
                match launcher.relaunch(killed).await {
                    Ok(_) => {
                        tracing::info!(process = %k.process, "restarted as scheduled");
                        k.restarted = Some(Instant::now());
                    }
                    Err(e) => {
                        let line = format!(
                            "hop \"{}\" replica {}: not restarted after its scheduled kill: {e}",
                            k.hop, k.replica
                        );
                        crate::tell!("warning: {line}");
                        self.incidents.push(line);
                    }
                }
            }
        }
    }

    /// The kills' records on the measured clock, and the incidents (a kill
    /// or restart that failed, one the load ended before).
    pub(super) fn finish(mut self, clock: &LoadClock) -> (Vec<KillRecord>, Vec<String>) {
        let mut records = Vec::new();
        for k in self.planned {
            if k.killed.is_none() && !k.over {
                self.incidents.push(format!(
                    "hop \"{}\" replica {}: never killed (the load ended before {} after warmup)",
                    k.hop,
                    k.replica,
                    humantime::format_duration(k.kill.at)
                ));
            }
            records.push(KillRecord {
                hop: k.hop,
                replica: k.replica,
                at_s: k.kill.at.as_secs_f64(),
                back_s: k.kill.back.map(|b| (k.kill.at + b).as_secs_f64()),
                killed_at_s: k.killed.as_ref().map(|(t, _)| clock.measured_s(*t)),
                restarted_at_s: k.restarted.map(|t| clock.measured_s(t)),
            });
        }
        (records, self.incidents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kill: &str) -> MeshPlan {
        let text = format!(
            "name = \"s\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"10s\"\n\
             warmup = \"1s\"\n[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\nreplicas = 2\n{kill}"
        );
        let scenario = crate::scenario::parse(&text, "s.toml").unwrap_or_else(|e| panic!("{e}"));
        MeshPlan::new(&scenario, &scenario.variants[0])
    }

    #[test]
    fn a_kill_is_planned_for_its_replica_at_warmup_plus_at() {
        let s = Duration::from_secs;
        let kills = Kills::plan(&plan("kill = { replica = 1, at = \"3s\", back = \"2s\" }"));
        assert_eq!(kills.planned.len(), 1);
        let k = &kills.planned[0];
        assert_eq!((k.process.as_str(), k.replica), ("hop-b-1", 1));
        assert_eq!((k.kill_at, k.back_at), (s(4), Some(s(6))));
        assert_eq!(kills.next_change(), Some(s(4)));

        let none = Kills::plan(&plan(""));
        assert!(none.planned.is_empty());
        assert_eq!(none.next_change(), None);
    }
}

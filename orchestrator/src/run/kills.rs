//! The kill schedule of a variant: each hop's `kill = { replica, at, back }`
//! carried out by the launcher, which SIGKILLs the replica's process by its
//! process id at `at` and, with `back`, starts it again from the same spec
//! at the same address `back` later, so its callers can reconnect.
//!
//! Times are on the measured clock like fault windows (see `faults`): a
//! kill at `at` happens `warmup + at` after the load's origin. A scheduled
//! death is not an incident: the launcher does not report the child it
//! killed as exited, and summary.json lists it under `kills`.
//!
//! Right after the kill and right before the restart (or when the load
//! ends), the callers of the hop are asked for their pick counts (the
//! load generator's pool directly, generator processes over their frame
//! connections, calling replicas through their Control API): the
//! difference is the calls each sent to the replica while it was down.
//! A generator process done by then counts with its final view.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tailmesh_services::{addr::PeerAddr, hop::PushPool};
use tokio::time::Instant;

use crate::{
    analysis::{CallerEndpoints, CallerPicks, KillRecord},
    launcher::{AnyLauncher, Killed},
    loadgen::{LoadClock, fleet::PicksAsker},
    plan::{Addrs, MeshPlan},
    scenario::Kill,
};

/// The kills of a variant, pending and done.
pub(super) struct Kills {
    planned: Vec<PlannedKill>,
    incidents: Vec<String>,
    /// The callers of each hop: the load generator's pools (the entry
    /// hops' it pushes to), or the generator processes that send the load,
    /// and the calling replicas' Control addresses.
    entries: Vec<Arc<PushPool>>,
    generators: Option<PicksAsker>,
    callers: BTreeMap<String, Vec<(String, PeerAddr)>>,
    token: Option<String>,
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
    /// Each caller's picks of the replica right after the kill, and the
    /// calls sent to it while it was down.
    picks_at_kill: BTreeMap<String, u64>,
    picks_while_down: Option<Vec<CallerPicks>>,
}

impl Kills {
    /// The kills of `plan`'s hops, whose processes are at `addrs`;
    /// `entries` are the load generator's pools, of the entries it pushes
    /// to, and `generators` asks the generator processes for theirs when
    /// they send the load.
    pub(super) fn plan(
        plan: &MeshPlan,
        launcher: &AnyLauncher,
        addrs: &Addrs,
        entries: Vec<Arc<PushPool>>,
        generators: Option<PicksAsker>,
    ) -> Self {
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
                    picks_at_kill: BTreeMap::new(),
                    picks_while_down: None,
                })
            })
            .collect();
        let mut callers: BTreeMap<String, Vec<(String, PeerAddr)>> = BTreeMap::new();
        let mut token = None;
        for (process, hop, replica) in plan.hops() {
            let addr = addrs
                .hops
                .get(&hop.name)
                .and_then(|a| a.get(replica as usize));
            let (Some((t, _)), Some(addr)) = (launcher.fault_place(&process.name), addr) else {
                continue;
            };
            token = Some(t.to_owned());
            for called in &hop.downstream {
                callers
                    .entry(called.clone())
                    .or_default()
                    .push((format!("{}/{replica}", hop.name), addr.clone()));
            }
        }
        Kills {
            planned,
            incidents: Vec::new(),
            entries,
            generators,
            callers,
            token,
        }
    }

    /// Each caller of `hop`'s picks of `replica` so far, for the callers
    /// that report them. The generator processes and the calling replicas
    /// are asked at once, so a restart waits for the slower of the two
    /// answers, not for both in turn.
    async fn picks(&self, hop: &str, replica: u32) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if let Some(picks) = crate::wire::pool_picks(&self.entries, hop, replica) {
            out.insert(crate::wire::LOADGEN_CALLER.to_owned(), picks);
        }
        let generators = async { self.generators.as_ref()?.picks(hop, replica).await };
        let callers = async {
            let (Some(token), Some(callers)) = (&self.token, self.callers.get(hop)) else {
                return Vec::new();
            };
            futures::future::join_all(callers.iter().map(|(caller, addr)| async move {
                (caller, super::endpoints::ask(addr, token).await)
            }))
            .await
        };
        let (generators, callers) = tokio::join!(generators, callers);
        for (index, picks) in generators.into_iter().flatten() {
            out.insert(crate::wire::generator_caller(index), picks);
        }
        for (caller, answer) in callers {
            if let Ok(Some(events)) = answer
                && let Some(picks) = events
                    .pools
                    .iter()
                    .find_map(|pool| crate::wire::replica_picks(pool, hop, replica))
            {
                out.insert(caller.clone(), picks);
            }
        }
        out
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
        for i in 0..self.planned.len() {
            let k = &self.planned[i];
            if k.over {
                continue;
            }
            let (hop, replica) = (k.hop.clone(), k.replica);
            let restart_due = k.killed.is_some() && k.back_at.is_some_and(|at| at <= since_origin);
            if restart_due {
                let now = self.picks(&hop, replica).await;
                self.planned[i].count_down_picks(&now);
            }
            let k = &mut self.planned[i];
            if k.killed.is_none() && k.kill_at <= since_origin {
                match launcher.kill(&k.process).await {
                    Ok(killed) => {
                        tracing::info!(process = %k.process, "killed as scheduled");
                        k.killed = Some((Instant::now(), killed));
                        k.over = k.back_at.is_none();
                        let at_kill = self.picks(&hop, replica).await;
                        self.planned[i].picks_at_kill = at_kill;
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
                && restart_due
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
    /// or restart that failed, one the load ended before). A replica still
    /// down has its callers' picks counted up to now: the generator
    /// processes', gone with the load, from their final views
    /// (`generators`).
    pub(super) async fn finish(
        mut self,
        clock: &LoadClock,
        generators: &[CallerEndpoints],
    ) -> (Vec<KillRecord>, Vec<String>) {
        for i in 0..self.planned.len() {
            let k = &self.planned[i];
            if k.killed.is_some() && k.picks_while_down.is_none() {
                let (hop, replica) = (k.hop.clone(), k.replica);
                let mut now = self.picks(&hop, replica).await;
                for view in generators {
                    if let Some(picks) = view.picks_of(&hop, replica) {
                        now.entry(view.caller.clone()).or_insert(picks);
                    }
                }
                self.planned[i].count_down_picks(&now);
            }
        }
        let mut records = Vec::new();
        for k in self.planned {
            if k.killed.is_none() && !k.over {
                self.incidents.push(format!(
                    "hop \"{}\" replica {}: never killed (the load ended before {} after warmup)",
                    k.hop,
                    k.replica,
                    tailmesh_units::duration(k.kill.at)
                ));
            }
            records.push(KillRecord {
                hop: k.hop,
                replica: k.replica,
                at_s: k.kill.at.as_secs_f64(),
                back_s: k.kill.back.map(|b| (k.kill.at + b).as_secs_f64()),
                killed_at_s: k.killed.as_ref().map(|(t, _)| clock.measured_s(*t)),
                restarted_at_s: k.restarted.map(|t| clock.measured_s(t)),
                picks_while_down: k.picks_while_down.unwrap_or_default(),
            });
        }
        (records, self.incidents)
    }
}

impl PlannedKill {
    /// The calls each caller sent while the replica was down: `now`'s
    /// picks less those at the kill (callers asked both times only).
    fn count_down_picks(&mut self, now: &BTreeMap<String, u64>) {
        self.picks_while_down = Some(
            now.iter()
                .filter_map(|(caller, picks)| {
                    let before = self.picks_at_kill.get(caller)?;
                    Some(CallerPicks {
                        caller: caller.clone(),
                        picks: picks.saturating_sub(*before),
                    })
                })
                .collect(),
        );
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
        let launcher =
            AnyLauncher::Local(crate::launcher::LocalLauncher::new("/nonexistent".into()));
        let addrs = Addrs::default();
        let kills = Kills::plan(
            &plan("kill = { replica = 1, at = \"3s\", back = \"2s\" }"),
            &launcher,
            &addrs,
            Vec::new(),
            None,
        );
        assert_eq!(kills.planned.len(), 1);
        let k = &kills.planned[0];
        assert_eq!((k.process.as_str(), k.replica), ("hop-b-1", 1));
        assert_eq!((k.kill_at, k.back_at), (s(4), Some(s(6))));
        assert_eq!(kills.next_change(), Some(s(4)));

        let none = Kills::plan(&plan(""), &launcher, &addrs, Vec::new(), None);
        assert!(none.planned.is_empty());
        assert_eq!(none.next_change(), None);
    }
}

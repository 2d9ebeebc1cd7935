//! Validation of one scenario tree (the base file, or a variant's copy of
//! it) into the checked model. Every problem is recorded; nothing stops
//! early, and a part that has problems simply yields no model.
//!
//! - here: the top-level keys, [`validate`], the `[[hop]]` array and the
//!   checks across sections;
//! - `load`, `check`, `report`, `telemetry`: one section each;
//! - `hop`: one `[[hop]]` in named steps, with `work`, `client` and
//!   `faults` for its sub-tables;
//! - `mesh`: the checks over every hop's downstream names.

mod check;
mod client;
mod faults;
mod hop;
mod load;
mod mesh;
mod report;
mod telemetry;
mod work;

use std::time::Duration;

use super::error::Problems;
use super::model::{
    Check, DEFAULT_DISTRIBUTION_TOLERANCE, DEFAULT_MAX_ERROR_RATE, Hop, Launcher, Load, MAX_HOPS,
    Report, Telemetry,
};
use super::read::{Section, dns_label_problem, is_dns_label, table_section};
use super::tree::{Node, Table, Value};

use check::check;
use faults::windows_within_the_load;
use hop::{HopDraft, hop};
use load::{EntryDraft, entries, entry_shares, load};
use mesh::mesh;
use report::{intervals_fit, report};
use telemetry::telemetry;

/// The slow threshold when the file has no `[check].slow_threshold`.
pub(super) const DEFAULT_SLOW_THRESHOLD: Duration = Duration::from_secs(1);

const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "seed",
    "launcher",
    "load",
    "hop",
    "variant",
    "check",
    "report",
    "sweep",
    "telemetry",
    "broker",
    "mesh",
];

/// Everything of a scenario tree, checked.
#[derive(Debug)]
pub(super) struct Parts {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub launcher: Launcher,
    pub load: Load,
    pub hops: Vec<Hop>,
    pub check: Check,
    pub report: Report,
    pub telemetry: Telemetry,
    pub broker: super::broker::Broker,
    pub mesh: super::model::Mesh,
}

/// Validates a whole tree; `Some` only if it has no problem at all.
pub(super) fn validate(root: &Table) -> (Option<Parts>, Problems) {
    let mut p = Problems::default();
    let top = Section {
        table: root,
        span: 0..0,
        prefix: String::new(),
        path: String::new(),
        label: "the top level".to_owned(),
    };
    top.unknown_keys(&mut p, TOP_KEYS);

    let name = top
        .required(&mut p, "name", Section::string)
        .and_then(|(name, entry)| {
            if is_dns_label(name) {
                Some(name.to_owned())
            } else {
                top.report(&mut p, &entry.node.span, dns_label_problem("name", name));
                None
            }
        });
    let description = match top.get("description") {
        None => Some(String::new()),
        Some(_) => top.string(&mut p, "description").map(|(s, _)| s.to_owned()),
    };
    let seed = match top.get("seed") {
        None => Some(1),
        Some(_) => top
            .int_min(&mut p, "seed", 0)
            .and_then(|s| u64::try_from(s).ok()),
    };
    let launcher = match top.get("launcher") {
        None => Some(None),
        Some(_) => top
            .choice(
                &mut p,
                "launcher",
                &[
                    ("local", Launcher::Local),
                    ("netns", Launcher::Netns),
                    ("auto", Launcher::Auto),
                ],
            )
            .map(Some),
    };
    let (load, entries) = match table_section(&top, &mut p, "load") {
        Some(Some(section)) => (load(&section, &mut p), entries(&section, &mut p)),
        Some(None) => (None, None),
        None => {
            top.missing(&mut p, "load");
            (None, None)
        }
    };
    let hops = hops(&top, &mut p, entries.as_deref());
    let mut load = load.map(|mut load| {
        load.entries = entries.as_deref().map(entry_shares).unwrap_or_default();
        load
    });
    if let (Some(hops), Some(load)) = (&hops, &mut load) {
        load::streams_enter_streaming_hops(&top, hops, load, &mut p);
    }
    if let (Some(hops), Some(load)) = (&hops, &load) {
        windows_within_the_load(&top, hops, load, &mut p);
        super::service::direct_entry_fits_the_load(&top, hops, load, &mut p);
    }
    let launcher = launcher.and_then(|launcher| {
        let faulty = net_faulty(hops.as_deref(), load.as_ref());
        match (launcher, faulty) {
            // Without a launcher named, network faults pick one that can
            // apply them (or fail when the run starts, saying why).
            (None, Some(_)) => Some(Launcher::Auto),
            (None, None) => Some(Launcher::Local),
            (Some(Launcher::Local), Some(faulty)) => {
                if let Some(entry) = top.get("launcher") {
                    top.report(
                        &mut p,
                        &entry.node.span,
                        format!(
                            "launcher = \"local\" cannot apply network faults ({faulty}): use \
                             launcher = \"netns\" (needs root or CAP_NET_ADMIN) or \"auto\""
                        ),
                    );
                }
                None
            }
            (Some(launcher), _) => Some(launcher),
        }
    });
    if let (Some(launcher), Some(hops)) = (launcher, &hops) {
        services_need_a_local_launcher(&top, &mut p, launcher, hops, load.as_ref());
    }
    let check = match table_section(&top, &mut p, "check") {
        Some(Some(section)) => check(&section, &mut p),
        Some(None) => None,
        None => Some(Check {
            slow_threshold: DEFAULT_SLOW_THRESHOLD,
            compounding: false,
            max_error_rate: DEFAULT_MAX_ERROR_RATE,
            distribution: false,
            distribution_tolerance: DEFAULT_DISTRIBUTION_TOLERANCE,
        }),
    };

    let report = match table_section(&top, &mut p, "report") {
        Some(Some(section)) => report(&section, &mut p),
        Some(None) => None,
        None => Some((Report::default(), None)),
    };
    if let (Some((report, at)), Some(load), Some(hops)) = (&report, &load, &hops) {
        intervals_fit(&mut p, report, *at, load, hops.len());
    }
    let report = report.map(|(report, _)| report);

    let telemetry = match table_section(&top, &mut p, "telemetry") {
        Some(Some(section)) => telemetry(&section, &mut p),
        Some(None) => None,
        None => Some(Telemetry::default()),
    };

    let broker = match table_section(&top, &mut p, "broker") {
        Some(Some(section)) => super::broker::broker(&section, &mut p),
        Some(None) => None,
        None => Some(super::broker::Broker::default()),
    };

    let mesh = match table_section(&top, &mut p, "mesh") {
        Some(Some(section)) => {
            let mesh = super::mesh::mesh(&section, &mut p);
            if let (Some(mesh), Some(broker), Some(hops)) = (&mesh, &broker, &hops) {
                super::mesh::check_support(&section, &mut p, mesh, broker.kind, hops);
            }
            mesh
        }
        Some(None) => None,
        None => Some(super::model::Mesh::default()),
    };

    let parts = match (
        name,
        description,
        seed,
        launcher,
        load,
        hops,
        check,
        report,
        telemetry,
        broker,
        mesh,
    ) {
        (
            Some(name),
            Some(description),
            Some(seed),
            Some(launcher),
            Some(load),
            Some(hops),
            Some(check),
            Some(report),
            Some(telemetry),
            Some(broker),
            Some(mesh),
        ) if p.is_empty() => Some(Parts {
            name,
            description,
            seed,
            launcher,
            load,
            hops,
            check,
            report,
            telemetry,
            broker,
            mesh,
        }),
        _ => None,
    };
    (parts, p)
}

/// Reports every `[hop.service]` of a variant that runs under the netns
/// launcher (`launcher = "netns"`, or `"auto"` with network faults): its
/// services would have to be started inside the replicas' namespaces,
/// which the netns launcher does not do yet.
/// What has a network fault, for people (`hop "b" has net or replica_net`,
/// `[load] has net or generator_net`); `None`: nothing.
fn net_faulty(hops: Option<&[Hop]>, load: Option<&Load>) -> Option<String> {
    if let Some(hop) = hops.and_then(|hops| hops.iter().find(|h| h.has_net_faults())) {
        return Some(format!("hop \"{}\" has net or replica_net", hop.name));
    }
    load.filter(|l| l.has_net_faults())
        .map(|_| "[load] has net or generator_net".to_owned())
}

fn services_need_a_local_launcher(
    top: &Section<'_>,
    p: &mut Problems,
    launcher: Launcher,
    hops: &[Hop],
    load: Option<&Load>,
) {
    let netns = match launcher {
        Launcher::Netns => true,
        Launcher::Auto => net_faulty(Some(hops), load).is_some(),
        Launcher::Local => false,
    };
    if !netns {
        return;
    }
    let Some(Value::Array(items)) = top.get("hop").map(|e| &e.node.value) else {
        return;
    };
    for item in items {
        let Value::Table(table) = &item.value else {
            continue;
        };
        if let Some(entry) = table.get("service") {
            let name = match table.get("name").map(|e| &e.node.value) {
                Some(Value::String(name)) => name.as_str(),
                _ => "?",
            };
            p.at(
                entry.key_span.start,
                format!(
                    "hop \"{name}\": service is not supported yet with the netns launcher \
                     (launcher = \"netns\", or network faults): its services would have to \
                     run in the replicas' namespaces; use the local launcher, without net \
                     and replica_net faults"
                ),
            );
        }
    }
}

/// Every `[[hop]]`, each read on its own ([`hop::hop`]), then the
/// mesh-wide checks over all of them ([`mesh::mesh`]).
/// The `[[hop]]` array; `entries` are `load.entries` (`None`: they had
/// a problem, so the mesh's reach is not checked).
fn hops(
    top: &Section<'_>,
    p: &mut Problems,
    entries: Option<&[EntryDraft<'_>]>,
) -> Option<Vec<Hop>> {
    let Some(entry) = top.get("hop") else {
        p.at(0, "missing [[hop]]: a scenario needs at least one hop");
        return None;
    };
    let tables: Vec<(&Node, &Table)> = match &entry.node.value {
        Value::Array(items) => {
            let mut tables = Vec::new();
            for item in items {
                match &item.value {
                    Value::Table(t) => tables.push((item, t)),
                    other => p.at(
                        item.span.start,
                        format!("expected a table for each [[hop]], got {}", other.kind()),
                    ),
                }
            }
            tables
        }
        _ => {
            top.wrong_type(p, entry, "an array of tables ([[hop]])");
            return None;
        }
    };
    if tables.is_empty() {
        p.at(entry.node.span.start, "a scenario needs at least one hop");
        return None;
    }
    if let Some((extra, _)) = tables.get(MAX_HOPS) {
        p.at(
            extra.span.start,
            format!(
                "too many hops: {} (at most {MAX_HOPS}); this is hop number {}",
                tables.len(),
                MAX_HOPS + 1
            ),
        );
    }

    let drafts: Vec<HopDraft<'_>> = tables
        .iter()
        .enumerate()
        .map(|(index, (node, table))| hop(index, node, table, p))
        .collect();
    let downstream = mesh(&drafts, entries, p);

    let mut hops = Vec::with_capacity(drafts.len());
    for (draft, calls) in drafts.into_iter().zip(downstream?) {
        let mut hop = draft.hop?;
        hop.downstream = calls.hops();
        hop.calls = calls;
        hops.push(hop);
    }
    (hops.len() <= MAX_HOPS).then_some(hops)
}

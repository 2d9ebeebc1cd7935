//! The mesh-wide checks once every hop is read: downstream and entry
//! names that exist, every hop reached from an entry, no cycle, and a
//! bound on the hops one request visits.

use std::collections::HashMap;

use tailmesh_model::calls::{Calls, MAX_VISITS, most_visits};

use crate::scenario::error::Problems;
use crate::scenario::tree::Span;

use super::hop::{Downstream, HopDraft};
use super::load::EntryDraft;

/// Mesh-wide checks of `downstream` and `load.entries` (`None`: they had
/// a problem; without any, the first hop is the entry): unknown names,
/// self calls, cycles, hops never called, `connection` on a hop only the
/// load generator calls. Returns each hop's calls when all is well.
pub(super) fn mesh(
    drafts: &[HopDraft<'_>],
    entries: Option<&[EntryDraft<'_>]>,
    p: &mut Problems,
) -> Option<Vec<Calls>> {
    let mut ok = true;
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, draft) in drafts.iter().enumerate() {
        let Some(name) = draft.raw_name else {
            ok = false;
            continue;
        };
        if let Some(&first) = index.get(name) {
            ok = false;
            p.at(
                draft.header.start,
                format!("duplicate hop name \"{name}\" (also used by the hop at index {first})"),
            );
        } else {
            index.insert(name, i);
        }
    }

    // Edges, each with the place that declares it. A file without any
    // `downstream` is a chain in file order; once one hop names its
    // downstream hops the file describes a tree, and a hop without the key
    // is a leaf (so a fan-out's leaves need not say `downstream = []`).
    let tree = drafts
        .iter()
        .any(|d| !matches!(d.downstream, Downstream::Chain));
    let mut edges: Vec<Vec<(usize, &Span)>> = vec![Vec::new(); drafts.len()];
    for (i, draft) in drafts.iter().enumerate() {
        let who = draft.raw_name.map_or_else(
            || format!("the hop at index {i}"),
            |n| format!("hop \"{n}\""),
        );
        match &draft.downstream {
            Downstream::Chain => {
                if !tree && i + 1 < drafts.len() {
                    edges[i].push((i + 1, draft.header));
                }
            }
            Downstream::Invalid => ok = false,
            Downstream::Stages(stages) => {
                for stage in stages {
                    for (k, call) in stage.iter().enumerate() {
                        let (name, span) = (call.name, call.span);
                        if stage[..k].iter().any(|earlier| earlier.name == name) {
                            ok = false;
                            p.at(
                                span.start,
                                format!(
                                    "downstream \"{name}\" of {who} is listed twice in one \
                                     stage (to call it more than once, give its count)"
                                ),
                            );
                        } else if Some(name) == draft.raw_name {
                            ok = false;
                            p.at(span.start, format!("{who} lists itself in downstream"));
                        } else if let Some(&j) = index.get(name) {
                            // One edge per hop called, whatever its stages.
                            if !edges[i].iter().any(|(e, _)| *e == j) {
                                edges[i].push((j, span));
                            }
                        } else {
                            ok = false;
                            p.at(
                                span.start,
                                format!("downstream \"{name}\" of {who} does not exist"),
                            );
                        }
                    }
                }
            }
        }
    }

    for (draft, out) in drafts.iter().zip(&edges) {
        let direct = draft
            .hop
            .as_ref()
            .and_then(|h| h.service.as_ref())
            .filter(|s| s.direct);
        if let Some(service) = direct
            && !out.is_empty()
        {
            ok = false;
            let key = if service.layers { "layers" } else { "direct" };
            p.at(
                draft.header.start,
                format!(
                    "hop \"{}\" has service.{key} = true, so it must be a leaf: its callers \
                     call the service itself and no tailmesh hop is there to call downstream \
                     hops (make it the last hop, or set downstream = [], or drop {key})",
                    draft.raw_name.unwrap_or_default()
                ),
            );
        }
    }
    if !cycles(drafts, &edges, p) {
        ok = false;
    }
    // The hops the load generator calls.
    let starts: Option<Vec<usize>> = match entries {
        None => None,
        Some([]) => Some(vec![0]),
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for e in list {
                match index.get(e.hop) {
                    Some(&i) => out.push(i),
                    None => {
                        ok = false;
                        p.at(
                            e.span.start,
                            format!("load.entries: hop \"{}\" does not exist", e.hop),
                        );
                    }
                }
            }
            Some(out)
        }
    };
    let starts = starts.filter(|_| ok);
    if let Some(starts) = &starts {
        let mut reached = vec![false; drafts.len()];
        let mut todo = starts.clone();
        while let Some(i) = todo.pop() {
            if std::mem::replace(&mut reached[i], true) {
                continue;
            }
            todo.extend(edges[i].iter().map(|(j, _)| *j));
        }
        let named: Vec<String> = starts
            .iter()
            .map(|&i| format!("\"{}\"", drafts[i].raw_name.unwrap_or_default()))
            .collect();
        let from = match named.as_slice() {
            [one] => format!("the entry hop {one}"),
            many => format!("the entry hops {}", many.join(", ")),
        };
        for (draft, reached) in drafts.iter().zip(&reached) {
            if !reached {
                ok = false;
                p.at(
                    draft.header.start,
                    format!(
                        "hop \"{}\" is never called: it is not reachable from {from}",
                        draft.raw_name.unwrap_or_default()
                    ),
                );
            }
        }
        // A hop only the load generator calls is reached over [load]'s
        // connections.
        for (j, draft) in drafts
            .iter()
            .enumerate()
            .filter(|(j, _)| starts.contains(j))
        {
            let called = edges.iter().flatten().any(|(to, _)| *to == j);
            if let Some(at) = draft.connection_at.filter(|_| !called) {
                ok = false;
                p.at(
                    at.start,
                    format!(
                        "hop \"{}\": connection is not for the entry hop, whose caller is the \
                         load generator: set load.connection instead",
                        draft.raw_name.unwrap_or_default()
                    ),
                );
            }
        }
    }
    let calls = ok.then(|| {
        drafts
            .iter()
            .zip(&edges)
            .map(|(draft, out)| match &draft.downstream {
                Downstream::Stages(stages) => Calls {
                    stages: stages
                        .iter()
                        .map(|stage| stage.iter().map(|c| c.call.clone()).collect())
                        .collect(),
                },
                // A chain's hop calls the next one once.
                _ => Calls::all_once(
                    out.iter()
                        .map(|(j, _)| drafts[*j].raw_name.unwrap_or_default()),
                ),
            })
            .collect::<Vec<Calls>>()
    })?;
    // Counts multiply down the tree: bound what one request can visit.
    let index = |name: &str| drafts.iter().position(|d| d.raw_name == Some(name));
    let mut memo = vec![None; calls.len()];
    let (visits, from) = starts?
        .into_iter()
        .map(|i| (most_visits(i, &|j| &calls[j], &index, &mut memo), i))
        .max()?;
    if visits > MAX_VISITS {
        p.at(
            drafts[from].header.start,
            format!(
                "a request may visit up to {} hops (counts multiply down the tree from the \
                 entry hop \"{}\"), more than {MAX_VISITS}: lower a count",
                visits,
                drafts[from].raw_name.unwrap_or_default()
            ),
        );
        return None;
    }
    Some(calls)
}

/// Reports each cycle once, at the edge that closes it; true if none.
fn cycles(drafts: &[HopDraft<'_>], edges: &[Vec<(usize, &Span)>], p: &mut Problems) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut mark = vec![Mark::New; drafts.len()];
    let mut acyclic = true;
    let name = |i: usize| {
        drafts[i]
            .raw_name
            .map_or_else(|| format!("hop at index {i}"), |n| format!("\"{n}\""))
    };
    for start in 0..drafts.len() {
        if mark[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (hop, next edge to follow).
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = Mark::OnPath;
        while let Some(top) = path.last_mut() {
            let (i, next) = *top;
            top.1 += 1;
            let Some(&(j, span)) = edges[i].get(next) else {
                mark[i] = Mark::Done;
                path.pop();
                continue;
            };
            match mark[j] {
                Mark::New => {
                    mark[j] = Mark::OnPath;
                    path.push((j, 0));
                }
                Mark::OnPath => {
                    acyclic = false;
                    let from = path.iter().position(|(k, _)| *k == j).unwrap_or(0);
                    let mut names: Vec<String> =
                        path[from..].iter().map(|(k, _)| name(*k)).collect();
                    names.push(name(j));
                    p.at(
                        span.start,
                        format!("downstream cycle: {}", names.join(" -> ")),
                    );
                }
                Mark::Done => {}
            }
        }
    }
    acyclic
}

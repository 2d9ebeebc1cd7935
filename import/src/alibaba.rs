//! Alibaba's microservice call graphs (cluster-trace-microservices-v2022,
//! MSCallGraph): CSV rows of `timestamp, traceid, service, rpc_id, um,
//! uminstanceid, rpctype, interface, dm, dminstanceid, rt`, read by their
//! header's names (an unnamed index column before them is ignored, and
//! `rpcid` is read as `rpc_id`).
//!
//! A row is a call from the upstream service `um` to the downstream `dm`.
//! A remote call is recorded twice under the same `rpc_id`: by the caller
//! (`rt` > 0, the time it waited) and by the callee (`rt` < 0, the time it
//! served); `rpc_id` gives the tree: `0.1.1` is a call made while serving
//! `0.1`. `timestamp` and `rt` are milliseconds, so an own time below a few
//! milliseconds is coarse: a child whose rounded wait is longer than its
//! caller's is clipped into it (counted as clock skew), an own time below 0
//! is 0, and sequential children in the same millisecond read as parallel.

use std::{collections::HashMap, io::BufRead};

use crate::{ByTrace, ImportError, Imported, Invocation, Repairs};

const COLUMNS: [&str; 10] = [
    "timestamp",
    "traceid",
    "rpc_id",
    "um",
    "uminstanceid",
    "rpctype",
    "interface",
    "dm",
    "dminstanceid",
    "rt",
];

#[derive(Debug, Clone, PartialEq)]
struct Row {
    timestamp_ms: f64,
    um: String,
    um_instance: String,
    interface: String,
    dm: String,
    dm_instance: String,
    rt_ms: f64,
}

/// One call: its caller's and its callee's records, either may be missing.
#[derive(Debug, Default)]
struct Call {
    caller: Option<Row>,
    callee: Option<Row>,
}

/// Reads a whole MSCallGraph file.
pub fn read(file: &str, input: impl BufRead) -> Result<Imported, ImportError> {
    let mut lines = input.lines();
    let header = match lines.next() {
        Some(line) => line.map_err(|e| ImportError::io(file, e))?,
        None => return Ok(Imported::default()),
    };
    let names: Vec<String> = fields(&header)
        .into_iter()
        .map(|n| {
            if n == "rpcid" {
                "rpc_id".to_string()
            } else {
                n
            }
        })
        .collect();
    let mut at = [0usize; COLUMNS.len()];
    for (slot, column) in at.iter_mut().zip(COLUMNS) {
        *slot =
            names
                .iter()
                .position(|n| n == column)
                .ok_or_else(|| ImportError::MissingColumn {
                    file: file.to_string(),
                    column,
                    header: names.join(","),
                })?;
    }
    let [ts, trace, rpc, um, umi, _rpctype, iface, dm, dmi, rt] = at;

    let mut repairs = Repairs::default();
    let mut traces: ByTrace<HashMap<String, Call>> = ByTrace::new();
    for (n, line) in lines.enumerate() {
        let line_no = n + 2;
        let line = line.map_err(|e| ImportError::io(file, e))?;
        if line.trim().is_empty() {
            continue;
        }
        repairs.records_read += 1;
        let f = fields(&line);
        let get = |i: usize| f.get(i).map(String::as_str).unwrap_or("");
        let number = |i: usize, what: &str| -> Result<Option<f64>, ImportError> {
            let text = get(i).trim();
            if text.is_empty() || text.eq_ignore_ascii_case("nan") {
                return Ok(None);
            }
            text.parse::<f64>().map(Some).map_err(|_| {
                ImportError::field(
                    file,
                    format!("line {line_no}"),
                    format!("{what} {text:?} is not a number"),
                )
            })
        };
        let (Some(timestamp_ms), Some(rt_ms)) = (number(ts, "timestamp")?, number(rt, "rt")?)
        else {
            repairs.drop("a row without a timestamp or rt");
            continue;
        };
        let (trace_id, rpc_id) = (get(trace).trim(), get(rpc).trim());
        if trace_id.is_empty() || rpc_id.is_empty() {
            repairs.drop("a row without a traceid or rpc_id");
            continue;
        }
        let row = Row {
            timestamp_ms,
            um: get(um).to_string(),
            um_instance: get(umi).to_string(),
            interface: get(iface).to_string(),
            dm: get(dm).to_string(),
            dm_instance: get(dmi).to_string(),
            rt_ms,
        };
        let call = traces
            .entry(trace_id)
            .entry(rpc_id.to_string())
            .or_default();
        let side = if rt_ms < 0.0 {
            &mut call.callee
        } else {
            &mut call.caller
        };
        match side {
            None => *side = Some(row),
            Some(first) if *first == row => repairs.duplicates += 1,
            Some(_) => {
                // The same call recorded twice, differently: the first kept.
                repairs.duplicates += 1;
                repairs.inconsistent += 1;
            }
        }
    }

    Ok(traces.assemble(repairs, "a trace with no call left", trace_tree))
}

/// The parent of `0.1.2` is `0.1`; of `0`, none.
fn parent_id(rpc_id: &str) -> Option<&str> {
    rpc_id.rsplit_once('.').map(|(p, _)| p)
}

fn trace_tree(calls: HashMap<String, Call>, repairs: &mut Repairs) -> Vec<Invocation> {
    let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut roots = Vec::new();
    for id in calls.keys() {
        match parent_id(id).filter(|p| calls.contains_key(*p)) {
            Some(p) => children.entry(p).or_default().push(id),
            None => roots.push(id.as_str()),
        }
    }
    roots.sort_by(|a, b| rpc_order(a, b));
    if roots.len() > 1 {
        repairs.rootless_traces += 1;
    }
    roots
        .into_iter()
        .filter_map(|id| {
            let mut inv = invocation(id, &calls, &children, repairs)?;
            inv.repair(repairs);
            Some(inv)
        })
        .collect()
}

/// `0.2` before `0.10`: rpc ids compare number by number.
fn rpc_order(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |s: &str| -> Vec<u64> {
        s.split('.')
            .map(|p| p.parse().unwrap_or(u64::MAX))
            .collect()
    };
    key(a).cmp(&key(b))
}

fn invocation(
    id: &str,
    calls: &HashMap<String, Call>,
    children: &HashMap<&str, Vec<&str>>,
    repairs: &mut Repairs,
) -> Option<Invocation> {
    let call = calls.get(id)?;
    let any = call.callee.as_ref().or(call.caller.as_ref())?;
    let ns = |ms: f64| (ms * 1e6).round() as i64;
    let served = call.callee.as_ref().unwrap_or(any);
    let waited = call.caller.as_ref().unwrap_or(any);
    let start = ns(served.timestamp_ms);
    let end = start + ns(served.rt_ms.abs());
    let called_at = ns(waited.timestamp_ms);
    let returned_at = called_at + ns(waited.rt_ms.abs());
    let instance = Some(any.dm_instance.clone()).filter(|i| !i.is_empty() && i != "UNKNOWN");
    let mut inv = Invocation {
        service: any.dm.clone(),
        instance,
        operation: any.interface.clone(),
        start,
        end,
        called_at,
        returned_at,
        error: false,
        own: None,
        children: Vec::new(),
        detached: Vec::new(),
    };
    let mut kids: Vec<&str> = children.get(id).cloned().unwrap_or_default();
    kids.sort_by(|a, b| rpc_order(a, b));
    for kid in kids {
        let Some(child) = invocation(kid, calls, children, repairs) else {
            continue;
        };
        // A child's caller must be this call's callee; the rpc ids are the
        // tree, so a contradiction is counted and the tree kept.
        let caller = calls
            .get(kid)
            .and_then(|c| c.caller.as_ref().or(c.callee.as_ref()))
            .map(|r| r.um.as_str());
        if caller.is_some_and(|c| c != inv.service) {
            repairs.inconsistent += 1;
        }
        inv.children.push(child);
    }
    Some(inv)
}

/// One CSV line's fields: commas separate, double quotes quote (`""` is a
/// quote inside them).
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    out.push(field);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        ",timestamp,traceid,service,rpc_id,um,uminstanceid,rpctype,interface,dm,dminstanceid,rt";

    fn file(rows: &[&str]) -> String {
        let mut text = HEADER.to_string();
        for (i, r) in rows.iter().enumerate() {
            text.push_str(&format!("\n{i},{r}"));
        }
        text
    }

    #[test]
    fn the_rpc_ids_make_the_tree_and_the_two_records_its_two_views() {
        let text = file(&[
            "100,T1,S1,0.1,USER,USER_0,http,login,A,A_POD_1,10",
            "100,T1,S1,0.1,USER,USER_0,http,login,A,A_POD_1,-9",
            "101,T1,S1,0.1.1,A,A_POD_1,rpc,get,B,B_POD_3,4",
            "101,T1,S1,0.1.1,A,A_POD_1,rpc,get,B,B_POD_3,-3",
            "106,T1,S1,0.1.2,A,A_POD_1,db,q,DB,UNKNOWN,2",
            // a duplicate row
            "106,T1,S1,0.1.2,A,A_POD_1,db,q,DB,UNKNOWN,2",
        ]);
        let imported = read("cg.csv", text.as_bytes()).expect("reads");
        assert_eq!(imported.repairs.duplicates, 1);
        assert_eq!(imported.traces.len(), 1);
        let a = &imported.traces[0][0];
        assert_eq!(
            (a.service.as_str(), a.instance.as_deref()),
            ("A", Some("A_POD_1"))
        );
        assert_eq!((a.start, a.end), (100_000_000, 109_000_000));
        assert_eq!((a.called_at, a.returned_at), (100_000_000, 110_000_000));
        assert_eq!(a.children.len(), 2);
        assert_eq!(a.children[0].service, "B");
        assert_eq!(a.children[1].instance, None);
        // A served 9 ms and waited 101..105 and 106..108: own 3 ms.
        assert_eq!(a.own_time(), 3_000_000);
    }

    #[test]
    fn contradictions_and_missing_parents_are_counted() {
        let text = file(&[
            "0,T2,S,0.1,USER,U,http,i,A,A1,5",
            // 0.1.1's caller should be A.
            "1,T2,S,0.1.1,X,X1,rpc,i,B,B1,2",
            // 0.3.1 hangs under a call that was never recorded.
            "2,T2,S,0.3.1,C,C1,rpc,i,D,D1,1",
            "3,T2,S,0.1,USER,U,http,i,A,A1,5",
            "4,T3,S,0.1,USER,U,http,i,A,A1,",
        ]);
        let imported = read("cg.csv", text.as_bytes()).expect("reads");
        let r = &imported.repairs;
        assert_eq!(r.inconsistent, 2, "{r:?}");
        assert_eq!(r.rootless_traces, 1);
        assert_eq!(r.dropped["a row without a timestamp or rt"], 1);
        assert_eq!(imported.traces[0].len(), 2);
    }

    #[test]
    fn bad_input_names_the_file_and_line() {
        let e = read("cg.csv", "timestamp,traceid\n".as_bytes()).expect_err("fails");
        assert!(
            e.to_string()
                .starts_with("cg.csv: line 1: no column \"rpc_id\""),
            "{e}"
        );
        let text = file(&["x1,T,S,0.1,U,U1,rpc,i,A,A1,3"]);
        let e = read("cg.csv", text.as_bytes()).expect_err("fails");
        assert_eq!(
            e.to_string(),
            "cg.csv: line 2: timestamp \"x1\" is not a number"
        );
    }

    #[test]
    fn quoted_fields_keep_their_commas() {
        assert_eq!(fields(r#"a,"b,c","d""e""#), ["a", "b,c", "d\"e"]);
        assert_eq!(rpc_order("0.2", "0.10"), std::cmp::Ordering::Less);
    }
}

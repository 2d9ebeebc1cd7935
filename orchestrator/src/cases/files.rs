//! The cases' files: each written whole or not at all, read back with
//! errors that name the file and what is wrong in it.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// What went wrong with a case's file.
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Bad { path: PathBuf, what: String },
}

impl CasesError {
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CasesError + '_ {
        move |source| CasesError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn bad(path: &Path, what: impl Into<String>) -> CasesError {
        CasesError::Bad {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }
}

/// Writes `text` to `path` through a hidden temporary file beside it.
pub fn write_whole(path: &Path, text: &[u8]) -> Result<(), CasesError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.partial"));
    std::fs::write(&temp, text).map_err(CasesError::io(&temp))?;
    std::fs::rename(&temp, path).map_err(CasesError::io(path))
}

/// Writes `value` as pretty JSON.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), CasesError> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| CasesError::bad(path, e.to_string()))?;
    write_whole(path, (text + "\n").as_bytes())
}

/// Reads JSON into `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, CasesError> {
    let text = std::fs::read_to_string(path).map_err(CasesError::io(path))?;
    serde_json::from_str(&text).map_err(|e| CasesError::bad(path, e.to_string()))
}

/// Tags of a run's spans that say what was injected, which a root-cause
/// tool must not see: a hop's `slow` flag and the work it drew
/// (`work_ns`, whose difference from `service_ns` is the injected delay).
const TRUTH_TAGS: [&str; 2] = ["slow", "work_ns"];

/// Copies a run's Jaeger file into a case without what gives the fault
/// away: the hops' `slow` and `work_ns` tags dropped, and an injected
/// error's message reads as an error's (`error at hop "b" replica 0`).
/// Returns the spans copied.
pub fn copy_traces(from: &Path, to: &Path) -> Result<u64, CasesError> {
    let text = std::fs::read_to_string(from).map_err(CasesError::io(from))?;
    let mut doc: Value =
        serde_json::from_str(&text).map_err(|e| CasesError::bad(from, e.to_string()))?;
    let traces = doc
        .get_mut("data")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| CasesError::bad(from, "no \"data\" array"))?;
    let mut spans = 0;
    for trace in traces {
        let Some(list) = trace.get_mut("spans").and_then(Value::as_array_mut) else {
            continue;
        };
        for span in list {
            spans += 1;
            let Some(tags) = span.get_mut("tags").and_then(Value::as_array_mut) else {
                continue;
            };
            tags.retain(|t| {
                !t.get("key")
                    .and_then(Value::as_str)
                    .is_some_and(|k| TRUTH_TAGS.contains(&k))
            });
            for tag in tags {
                if let Some(Value::String(v)) = tag.get_mut("value")
                    && v.contains("injected error")
                {
                    *v = v.replace("injected error", "error");
                }
            }
        }
    }
    let out = serde_json::to_vec(&doc).map_err(|e| CasesError::bad(to, e.to_string()))?;
    write_whole(to, &out)?;
    Ok(spans)
}

/// Reads an outside tool's ranking for one case: `<case>.json` (a list of
/// service names, a list of objects with a `service`, or an object whose
/// `ranking` is either) or `<case>.csv` (one service per row, most
/// suspect first, in the column named `service` when the first row is a
/// header with one, else the first column). `None` when the folder has
/// neither file.
pub fn read_ranking(dir: &Path, case: &str) -> Result<Option<Vec<String>>, CasesError> {
    let json = dir.join(format!("{case}.json"));
    if json.exists() {
        let value: Value = read_json(&json)?;
        let list = value.get("ranking").unwrap_or(&value);
        let items = list.as_array().ok_or_else(|| {
            CasesError::bad(
                &json,
                "a ranking is a list, or an object with a \"ranking\" list",
            )
        })?;
        let names = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str()
                    .or_else(|| item.get("service").and_then(Value::as_str))
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        CasesError::bad(
                            &json,
                            format!(
                                "entry {}: neither a service name nor an object with a \"service\"",
                                i + 1
                            ),
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        return Ok(Some(names));
    }
    let csv = dir.join(format!("{case}.csv"));
    if !csv.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&csv).map_err(CasesError::io(&csv))?;
    let rows = crate::output::csv::split_rows(&text);
    let column = rows
        .first()
        .and_then(|header| header.iter().position(|c| c.trim() == "service"));
    let body = if column.is_some() {
        &rows[1..]
    } else {
        &rows[..]
    };
    let column = column.unwrap_or(0);
    let names = body
        .iter()
        .enumerate()
        .filter(|(_, row)| row.iter().any(|c| !c.trim().is_empty()))
        .map(|(i, row)| {
            row.get(column)
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .ok_or_else(|| {
                    CasesError::bad(
                        &csv,
                        format!("row {}: no service in column {}", i + 1, column + 1),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(names))
}

/// Reads the rows of a samples file (`variant` first, then `fields`
/// more) that are `variant`'s, each made into a `T` by `make` from its
/// fields after the variant and a parser of numbers that names the line.
fn read_samples<T>(
    path: &Path,
    variant: &str,
    fields: usize,
    make: impl Fn(&[String], &dyn Fn(&str) -> Result<f64, CasesError>) -> Result<T, CasesError>,
) -> Result<Vec<T>, CasesError> {
    let text = std::fs::read_to_string(path).map_err(CasesError::io(path))?;
    let mut out = Vec::new();
    for (i, row) in crate::output::csv::split_rows(&text)
        .into_iter()
        .enumerate()
        .skip(1)
    {
        let line = i + 1;
        if row.len() != fields + 1 {
            return Err(CasesError::bad(
                path,
                format!("line {line}: {} fields expected", fields + 1),
            ));
        }
        if row[0] != variant {
            continue;
        }
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|_| CasesError::bad(path, format!("line {line}: {s:?} is not a number")))
        };
        out.push(make(&row[1..], &num)?);
    }
    Ok(out)
}

/// Reads a run's `processes.csv` (`variant,t_s,process,pid,cpu_s,rss_bytes`):
/// `variant`'s samples.
pub fn read_processes(
    path: &Path,
    variant: &str,
) -> Result<Vec<super::series::ProcessSample>, CasesError> {
    read_samples(path, variant, 5, |f, num| {
        Ok(super::series::ProcessSample {
            t_s: num(&f[0])?,
            process: f[1].clone(),
            pid: num(&f[2])? as u32,
            cpu_s: num(&f[3])?,
            rss_bytes: num(&f[4])? as u64,
        })
    })
}

/// Reads a run's `queues.csv` (`variant,t_s,topic,depth,in_flight`):
/// `variant`'s samples.
pub fn read_queues(
    path: &Path,
    variant: &str,
) -> Result<Vec<super::series::QueueSample>, CasesError> {
    read_samples(path, variant, 4, |f, num| {
        Ok(super::series::QueueSample {
            t_s: num(&f[0])?,
            topic: f[1].clone(),
            depth: num(&f[2])? as u64,
            in_flight: num(&f[3])? as u64,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tailmesh-cases-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        d
    }

    #[test]
    fn an_outside_tools_ranking_reads_from_json_or_csv() {
        let d = dir("rank");
        std::fs::write(d.join("case-000.json"), r#"["b", "a"]"#).expect("test file");
        std::fs::write(
            d.join("case-001.json"),
            r#"{"ranking": [{"service": "c", "score": 2}, {"service": "a"}]}"#,
        )
        .expect("test file");
        std::fs::write(d.join("case-002.csv"), "rank,service\n1,a\n2,c\n").expect("test file");
        std::fs::write(d.join("case-003.csv"), "b\nc\n\n").expect("test file");
        std::fs::write(d.join("case-004.json"), r#"{"ranking": [3]}"#).expect("test file");
        let read = |c: &str| read_ranking(&d, c).map_err(|e| e.to_string());
        assert_eq!(read("case-000"), Ok(Some(vec!["b".into(), "a".into()])));
        assert_eq!(read("case-001"), Ok(Some(vec!["c".into(), "a".into()])));
        assert_eq!(read("case-002"), Ok(Some(vec!["a".into(), "c".into()])));
        assert_eq!(read("case-003"), Ok(Some(vec!["b".into(), "c".into()])));
        let bad = read("case-004").expect_err("an error");
        assert!(
            bad.contains("case-004.json") && bad.contains("entry 1"),
            "{bad}"
        );
        assert_eq!(read("case-005"), Ok(None));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_cases_traces_do_not_say_what_was_injected() {
        let d = dir("traces");
        let from = d.join("in.json");
        std::fs::write(
            &from,
            r#"{"data":[{"traceID":"1","spans":[{"spanID":"2","tags":[
                {"key":"slow","type":"bool","value":true},
                {"key":"work_ns","type":"int64","value":5},
                {"key":"service_ns","type":"int64","value":9},
                {"key":"otel.status_description","type":"string","value":"hop \"a\": injected error at hop \"b\" replica 0"}
            ]}]}]}"#,
        )
        .expect("test file");
        let to = d.join("out.json");
        assert_eq!(copy_traces(&from, &to).map_err(|e| e.to_string()), Ok(1));
        let text = std::fs::read_to_string(&to).expect("test file");
        assert!(
            !text.contains("\"slow\"") && !text.contains("work_ns") && !text.contains("injected"),
            "{text}"
        );
        assert!(
            text.contains("service_ns") && text.contains("error at hop \\\"b\\\" replica 0"),
            "{text}"
        );
        std::fs::write(&from, "{}").expect("test file");
        let e = copy_traces(&from, &to).expect_err("an error").to_string();
        assert!(e.contains("in.json") && e.contains("data"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn process_samples_read_back_for_their_variant() {
        let d = dir("procs");
        let p = d.join("processes.csv");
        std::fs::write(&p, "variant,t_s,process,pid,cpu_s,rss_bytes\nbase,1.000,hop-a-0,7,0.25,4096\nother,1.000,hop-a-0,8,1,1\n").expect("test file");
        let s = read_processes(&p, "base").map_err(|e| e.to_string());
        assert_eq!(s.as_ref().map(Vec::len), Ok(1));
        assert_eq!(s.as_ref().map(|s| s[0].rss_bytes), Ok(4096));
        std::fs::write(
            &p,
            "variant,t_s,process,pid,cpu_s,rss_bytes\nbase,x,hop-a-0,7,0.25,4096\n",
        )
        .expect("test file");
        let e = read_processes(&p, "base")
            .expect_err("an error")
            .to_string();
        assert!(e.contains("line 2") && e.contains("\"x\""), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}

//! `requests.csv`: one row per measured request of every variant.
//!
//! Columns: `variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes`.
//!
//! - Times are microseconds since the start of the measured phase with
//!   exactly three decimals (nanosecond resolution, printed from integers,
//!   no float rounding); `latency_us` is `end - intended`.
//! - `status` is `Outcome::label` ("ok", "timeout", "unavailable", ...).
//!   Error messages are not written (they are in the logs).
//! - `slow_hops`: names of the hops with injected slowness, joined by `;`.
//! - `path`: `hop/replica/service_us` per path record, joined by `;`.
//! - `extra_attempts`: attempts the load generator sent beyond the first
//!   (retries and hedges of the first hop's client policy).
//! - `cause`: a slow request's primary cause (`injected:b`, `queue:b`,
//!   `network:a->b`, `work:b`, `generator`, `unexplained`; see
//!   `analysis::attribution`); empty for requests that were not slow.
//! - `causes`: every cause of a slow request with its duration, largest
//!   first, e.g. `injected:b=20.113ms;queue:c=4.020ms`.
//! - Fields containing `,`, `"`, CR or LF are quoted per RFC 4180; lines end
//!   in `\n`.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::OutputError;
use crate::analysis::attribution::attribute;
use crate::record::{Outcome, RequestRecord};

/// The header line, without its line end.
pub const CSV_HEADER: &str = "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes";

/// The header of files written before the cause columns.
const CSV_HEADER_V1: &str =
    "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts";

/// Writes every variant's records to `path`, variants in the given order;
/// requests over `slow_threshold` get their causes.
pub fn write_requests_csv(
    path: &Path,
    variants: &[(&str, &[RequestRecord])],
    slow_threshold: Duration,
) -> Result<(), OutputError> {
    super::write_atomically(path, |out| write_rows(out, variants, slow_threshold))
}

fn write_rows(
    out: &mut impl Write,
    variants: &[(&str, &[RequestRecord])],
    slow_threshold: Duration,
) -> std::io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    for &(variant, records) in variants {
        let variant = quote(variant);
        for r in records {
            let slow_hops: Vec<&str> = r
                .path
                .iter()
                .filter(|h| h.slow)
                .map(|h| h.hop.as_str())
                .collect();
            let path: Vec<String> = r
                .path
                .iter()
                .map(|h| {
                    format!(
                        "{}/{}/{}",
                        h.hop,
                        h.replica,
                        micros3(Duration::from_nanos(h.service_ns))
                    )
                })
                .collect();
            let (cause, causes) = match attribute(r, slow_threshold) {
                Some(a) => (
                    a.primary(),
                    a.causes()
                        .iter()
                        .map(|c| {
                            let ns = c.duration.as_nanos();
                            format!(
                                "{}={}.{:03}ms",
                                c.label(),
                                ns / 1_000_000,
                                ns / 1_000 % 1_000
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(";"),
                ),
                None => (String::new(), String::new()),
            };
            writeln!(
                out,
                "{variant},{},{},{},{},{},{},{},{},{},{},{}",
                r.id,
                micros3(r.intended),
                micros3(r.start),
                micros3(r.end),
                micros3(r.latency()),
                quote(&r.outcome.label()),
                quote(&slow_hops.join(";")),
                quote(&path.join(";")),
                r.extra_attempts,
                quote(&cause),
                quote(&causes),
            )?;
        }
    }
    Ok(())
}

/// `d` in microseconds with three decimals, e.g. `1234.567`.
pub fn micros3(d: Duration) -> String {
    let ns = d.as_nanos();
    format!("{}.{:03}", ns / 1_000, ns % 1_000)
}

/// `field` quoted per RFC 4180 when it needs to be.
fn quote(field: &str) -> Cow<'_, str> {
    if field.contains([',', '"', '\r', '\n']) {
        Cow::Owned(format!("\"{}\"", field.replace('"', "\"\"")))
    } else {
        Cow::Borrowed(field)
    }
}

/// Splits CSV text into rows of fields, honouring RFC 4180 quotes. A last
/// line without a line end is kept.
pub fn split_rows(text: &str) -> Vec<Vec<String>> {
    let (mut rows, mut row, mut field) = (Vec::new(), Vec::new(), String::new());
    let (mut quoted, mut chars) = (false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

/// Reads a `requests.csv` back: each row's variant and its record. Error
/// messages are not in the file, so errors come back with an empty one;
/// path records carry hop, replica, service time and the slow flag. The
/// cause columns are derived, and not read; files from before them read.
pub fn read_requests_csv(path: &Path) -> Result<Vec<(String, RequestRecord)>, OutputError> {
    let text = std::fs::read_to_string(path).map_err(OutputError::io(path))?;
    let bad = |line: usize, what: String| OutputError::Parse {
        path: path.to_path_buf(),
        line,
        what,
    };
    let mut rows = split_rows(&text).into_iter().enumerate();
    let fields = match rows.next() {
        Some((_, header)) if header.join(",") == CSV_HEADER => 12,
        Some((_, header)) if header.join(",") == CSV_HEADER_V1 => 10,
        _ => return Err(bad(1, format!("the first line must be {CSV_HEADER}"))),
    };
    let mut out = Vec::new();
    for (i, mut row) in rows {
        let line = i + 1;
        if row.len() != fields {
            return Err(bad(
                line,
                format!("{} fields, expected {fields}", row.len()),
            ));
        }
        row.truncate(10);
        let [
            variant,
            id,
            intended,
            start,
            end,
            _latency,
            status,
            slow_hops,
            path_field,
            extra,
        ] = <[String; 10]>::try_from(row)
            .map_err(|r| bad(line, format!("{} fields, expected 10", r.len())))?;
        let id = id
            .parse::<u64>()
            .map_err(|e| bad(line, format!("id {id:?}: {e}")))?;
        let time =
            |field: &str| parse_micros3(field).ok_or_else(|| bad(line, format!("time {field:?}")));
        let slow: Vec<&str> = slow_hops.split(';').filter(|s| !s.is_empty()).collect();
        let mut path = Vec::new();
        for entry in path_field.split(';').filter(|s| !s.is_empty()) {
            let mut parts = entry.rsplitn(3, '/');
            let (Some(service), Some(replica), Some(hop)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad(line, format!("path entry {entry:?}")));
            };
            path.push(tailmesh_proto::pb::HopRecord {
                hop: hop.to_string(),
                replica: replica
                    .parse()
                    .map_err(|e| bad(line, format!("replica in {entry:?}: {e}")))?,
                service_ns: u64::try_from(time(service)?.as_nanos()).unwrap_or(u64::MAX),
                slow: slow.contains(&hop),
                ..Default::default()
            });
        }
        let record = RequestRecord {
            id,
            intended: time(&intended)?,
            start: time(&start)?,
            end: time(&end)?,
            outcome: Outcome::from_label(&status)
                .ok_or_else(|| bad(line, format!("status {status:?}")))?,
            path,
            extra_attempts: extra
                .parse()
                .map_err(|e| bad(line, format!("extra_attempts {extra:?}: {e}")))?,
        };
        out.push((variant, record));
    }
    Ok(out)
}

/// Parses [`micros3`]'s output back.
fn parse_micros3(field: &str) -> Option<Duration> {
    let (us, frac) = field.split_once('.')?;
    let (us, frac): (u64, u64) = (us.parse().ok()?, frac.parse().ok()?);
    (frac < 1000).then(|| Duration::from_nanos(us.saturating_mul(1000).saturating_add(frac)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::testing::{mixed_records, ok_records};

    const MS15: Duration = Duration::from_millis(15);

    #[test]
    fn files_without_the_cause_columns_still_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        std::fs::write(
            &path,
            format!("{CSV_HEADER_V1}\nbase,3,0.000,1.000,9.000,9.000,ok,,a/0/5.000,0\n"),
        )
        .expect("write");
        let back = read_requests_csv(&path).expect("an older file reads");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].1.path.len(), 1);
    }

    fn parse(text: &str) -> Vec<Vec<String>> {
        let rows = split_rows(text);
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "text must end with a line end"
        );
        rows
    }

    #[test]
    fn records_read_back_as_written() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mixed = mixed_records();
        write_requests_csv(&path, &[("a, \"b\"", &mixed)], MS15).expect("written");
        let back = read_requests_csv(&path).expect("read back");
        assert_eq!(back.len(), mixed.len());
        for ((variant, got), want) in back.iter().zip(&mixed) {
            assert_eq!(variant, "a, \"b\"");
            assert_eq!(
                (got.id, got.intended, got.start, got.end),
                (want.id, want.intended, want.start, want.end)
            );
            assert_eq!(got.outcome.label(), want.outcome.label());
            let hops = |r: &RequestRecord| {
                r.path
                    .iter()
                    .map(|h| (h.hop.clone(), h.replica, h.service_ns, h.slow))
                    .collect::<Vec<_>>()
            };
            assert_eq!(hops(got), hops(want));
        }
        std::fs::write(&path, "variant,id\nx,1\n").expect("write");
        assert!(matches!(
            read_requests_csv(&path),
            Err(OutputError::Parse { line: 1, .. })
        ));
    }

    #[test]
    fn one_row_per_record_plus_header_and_fields_round_trip() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mixed = mixed_records();
        let ok = ok_records();
        let odd_name = "push, \"fast\"";
        write_requests_csv(&path, &[(odd_name, &mixed), ("pull", &ok[..2])], MS15)
            .expect("written");
        let rows = parse(&std::fs::read_to_string(&path).expect("readable"));
        assert_eq!(rows.len(), mixed.len() + 2 + 1);
        assert_eq!(rows[0].join(","), CSV_HEADER);
        assert!(
            rows.iter().all(|r| r.len() == 12),
            "every row has 12 fields"
        );

        // Request 0: slow at a, b and c; 100 µs late; 21 ms latency.
        let r0 = &rows[1];
        assert_eq!(r0[0], odd_name);
        assert_eq!(
            r0[1..7],
            ["0", "0.000", "100.000", "21000.000", "21000.000", "ok"]
        );
        assert_eq!(r0[7], "c;b;a");
        assert_eq!(r0[8], "c/0/20300.000;b/0/20300.000;a/0/20300.000");
        // Injected everywhere, 20.3 ms of service at each hop.
        assert_eq!(r0[10], "injected:a");
        assert!(r0[11].starts_with("injected:a=20.300ms;"), "{}", r0[11]);
        // Request 111: slow nowhere.
        assert_eq!((rows[112][10].as_str(), rows[112][11].as_str()), ("", ""));
        assert_eq!(rows[112][7], "");
        assert_eq!(rows[112][8], "c/1/300.000;b/1/300.000;a/1/300.000");
        // Failures: status label, no path.
        let timeout = &rows[1 + 1000];
        assert_eq!((timeout[6].as_str(), timeout[8].as_str()), ("timeout", ""));
        assert_eq!(rows[1 + 1005][6], "unavailable");
        assert_eq!(rows.last().map(|r| r[0].as_str()), Some("pull"));

        for (row, rec) in rows[1..].iter().zip(&mixed) {
            assert_eq!(row[1], rec.id.to_string());
            assert_eq!(row[5], micros3(rec.latency()));
        }
    }

    #[test]
    fn times_keep_nanoseconds() {
        assert_eq!(micros3(Duration::from_nanos(1_234_567)), "1234.567");
        assert_eq!(micros3(Duration::from_nanos(5)), "0.005");
    }

    #[test]
    fn quoting_follows_rfc_4180() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bad = dir.path().join("nope").join("requests.csv");
        let err = write_requests_csv(&bad, &[], MS15).expect_err("no such folder");
        assert!(err.to_string().contains("nope/requests.csv"), "{err}");
    }
}

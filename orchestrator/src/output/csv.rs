//! `requests.csv`: one row per measured request of every variant.
//!
//! Columns: `variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path`.
//!
//! - Times are microseconds since the start of the measured phase with
//!   exactly three decimals (nanosecond resolution, printed from integers,
//!   no float rounding); `latency_us` is `end - intended`.
//! - `status` is `Outcome::label` ("ok", "timeout", "unavailable", ...).
//!   Error messages are not written (they are in the logs).
//! - `slow_hops`: names of the hops with injected slowness, joined by `;`.
//! - `path`: `hop/replica/service_us` per path record, joined by `;`.
//! - Fields containing `,`, `"`, CR or LF are quoted per RFC 4180; lines end
//!   in `\n`.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use super::OutputError;
use crate::record::RequestRecord;

/// The header line, without its line end.
pub const CSV_HEADER: &str =
    "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path";

/// Writes every variant's records to `path`, variants in the given order.
pub fn write_requests_csv(
    path: &Path,
    variants: &[(&str, &[RequestRecord])],
) -> Result<(), OutputError> {
    let file = File::create(path).map_err(OutputError::io(path))?;
    let mut out = BufWriter::new(file);
    write_rows(&mut out, variants)
        .and_then(|()| out.flush())
        .map_err(OutputError::io(path))
}

fn write_rows(out: &mut impl Write, variants: &[(&str, &[RequestRecord])]) -> std::io::Result<()> {
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
            writeln!(
                out,
                "{variant},{},{},{},{},{},{},{},{}",
                r.id,
                micros3(r.intended),
                micros3(r.start),
                micros3(r.end),
                micros3(r.latency()),
                quote(&r.outcome.label()),
                quote(&slow_hops.join(";")),
                quote(&path.join(";")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::testing::{mixed_records, ok_records};

    /// Splits CSV text into records of fields, honouring RFC 4180 quotes.
    fn parse(text: &str) -> Vec<Vec<String>> {
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
        assert!(
            field.is_empty() && row.is_empty(),
            "text must end with a line end"
        );
        rows
    }

    #[test]
    fn one_row_per_record_plus_header_and_fields_round_trip() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mixed = mixed_records();
        let ok = ok_records();
        let odd_name = "push, \"fast\"";
        write_requests_csv(&path, &[(odd_name, &mixed), ("pull", &ok[..2])]).expect("written");
        let rows = parse(&std::fs::read_to_string(&path).expect("readable"));
        assert_eq!(rows.len(), mixed.len() + 2 + 1);
        assert_eq!(rows[0].join(","), CSV_HEADER);
        assert!(rows.iter().all(|r| r.len() == 9), "every row has 9 fields");

        // Request 0: slow at a, b and c; 100 µs late; 21 ms latency.
        let r0 = &rows[1];
        assert_eq!(r0[0], odd_name);
        assert_eq!(
            r0[1..7],
            ["0", "0.000", "100.000", "21000.000", "21000.000", "ok"]
        );
        assert_eq!(r0[7], "c;b;a");
        assert_eq!(r0[8], "c/0/20300.000;b/0/20300.000;a/0/20300.000");
        // Request 111: slow nowhere.
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
        let err = write_requests_csv(&bad, &[]).expect_err("no such folder");
        assert!(err.to_string().contains("nope/requests.csv"), "{err}");
    }
}

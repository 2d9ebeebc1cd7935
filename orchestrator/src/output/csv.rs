//! `requests.csv`: one row per measured request of every variant, written
//! as the run goes (a request's row as soon as it completes, into
//! `.requests.csv.partial`, renamed to `requests.csv` when the run's files
//! are written: the file is whole or absent), and read back one row at a
//! time.
//!
//! Format version 5 (the header line says which version a file is; every
//! version reads). Columns:
//! `variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes,retried,hops,error,calls,attempts,stream`.
//!
//! - Times are microseconds since the start of the measured phase with
//!   exactly three decimals (nanosecond resolution, printed from integers,
//!   no float rounding); `latency_us` is `end - intended`.
//! - `status` is `Outcome::label` ("ok", "timeout", "unavailable", ...).
//! - `slow_hops`: names of the hops with injected slowness, joined by `;`.
//! - `path`: `hop/replica/service_us` per path record, joined by `;`.
//! - `extra_attempts`: attempts the load generator sent beyond the first
//!   (retries and hedges of the first hop's client policy).
//! - `cause`: a slow request's primary cause (`injected:b`, `queue:b`,
//!   `network:a->b`, `work:b`, `generator`, `unexplained`; see
//!   `analysis::attribution`); empty for requests that were not slow.
//! - `causes`: every cause of a slow request with its duration, largest
//!   first, e.g. `injected:b=20.113ms;queue:c=4.020ms`.
//! - `retried` (v3): `1` if any attempt beyond the first was sent for the
//!   request, by the load generator or a hop on its path (a retry or a
//!   hedge), else `0`.
//! - `hops` (v3): the rest of each path record, in `path`'s order:
//!   `total_us/queue_wait_us/parent/transport/extra_attempts/slot_wait_us`,
//!   joined by `;` (`parent` is empty for the first hop; `slot_wait_us`,
//!   the part of the queue wait spent waiting for a slot in the replica,
//!   from v4 on).
//! - `error` (v3): an error's message (empty unless the status is an
//!   error), so the rows carry everything analysis reads.
//! - `calls` (v4): each path record's downstream calls, in `path`'s order,
//!   joined by `;` (an empty entry for a record that called nothing); a
//!   record's calls joined by `|`, each `hop@call_us:attempts`, as its
//!   caller timed it.
//! - `attempts` (v4): the load generator's own attempts at the first hop
//!   (empty when the call was abandoned), in the syntax of a call's.
//! - Attempts, in the order sent, are joined by `/`, each
//!   `start_us+took_us` then how it ended: `ok`, `failed`, or `cancelled`
//!   (still running when another answered; its time censored there).
//!   E.g. `0.000+15000.000cancelled/10000.000+5000.000ok`: a hedge sent
//!   after 10 ms answered 5 ms later, and the first was cancelled.
//! - `stream` (v5): a message of the load's streams (`[load.streams]`) as
//!   `stream/message`: its stream, numbered in the order the streams
//!   opened (warmup's included), and its place on it, from 0; empty for a
//!   call.
//! - Fields containing `,`, `"`, CR or LF are quoted per RFC 4180; lines end
//!   in `\n`.
//!
//! Version 1 had the first 10 columns, version 2 the first 12, version 3
//! the first 15 (and no `slot_wait_us` in `hops`), version 4 the first 17.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
    mpsc::SyncSender,
};
use std::thread::JoinHandle;
use std::time::Duration;

use tailmesh_services::turns::Turns;

use super::OutputError;
use crate::analysis::attribution::attribute;
use crate::record::{
    AttemptEnd, AttemptTiming, CallTiming, HopRecord, Outcome, RequestRecord, StreamPlace,
};

/// The header line, without its line end: version 5.
pub const CSV_HEADER: &str = "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes,retried,hops,error,calls,attempts,stream";

/// The format version [`CSV_HEADER`] stands for.
pub const CSV_VERSION: u32 = 5;

/// The header of version 4 files (before `stream`).
const CSV_HEADER_V4: &str = "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes,retried,hops,error,calls,attempts";

/// The header of version 3 files (before `calls`, `attempts` and the slot
/// wait in `hops`).
const CSV_HEADER_V3: &str = "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes,retried,hops,error";

/// The header of version 2 files (before `retried`, `hops`, `error`).
const CSV_HEADER_V2: &str = "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes";

/// The header of version 1 files (before the cause columns).
const CSV_HEADER_V1: &str =
    "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts";

/// What the writer buffers before a write reaches the file.
const BUFFER: usize = 64 * 1024;

/// Writes every variant's records to `path`, variants in the given order;
/// requests over `slow_threshold` get their causes. Whole or not at all.
pub fn write_requests_csv(
    path: &Path,
    variants: &[(&str, &[RequestRecord])],
    slow_threshold: Duration,
) -> Result<(), OutputError> {
    let mut writer = RequestsWriter::create(path, slow_threshold)?;
    for &(variant, records) in variants {
        writer.begin_variant(variant);
        for r in records {
            writer.write(r)?;
        }
    }
    writer.finish()
}

/// `requests.csv` written one request at a time as the run goes: rows go
/// to a hidden `.requests.csv.partial` beside it, which [`finish`] syncs
/// and renames to `requests.csv`. A write that fails (a full disk) removes
/// the partial file and is reported once; until `finish` or a failure, a
/// dropped writer removes it too, so the file is whole or absent.
///
/// [`finish`]: RequestsWriter::finish
pub struct RequestsWriter {
    path: PathBuf,
    partial: PathBuf,
    out: Option<BufWriter<File>>,
    slow_threshold: Duration,
    /// The current variant's name, quoted for the file.
    variant: String,
    rows: u64,
    /// Why the file could not be written, once it could not.
    failure: Option<std::io::Error>,
    peak_buffered: usize,
}

impl std::fmt::Debug for RequestsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestsWriter")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .field("failure", &self.failure)
            .finish()
    }
}

impl RequestsWriter {
    /// Starts `path`'s partial file with the header; requests slower than
    /// `slow_threshold` get their causes.
    pub fn create(path: &Path, slow_threshold: Duration) -> Result<RequestsWriter, OutputError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let partial = path.with_file_name(format!(".{name}.partial"));
        let mut writer = RequestsWriter {
            path: path.to_path_buf(),
            partial,
            out: None,
            slow_threshold,
            variant: String::new(),
            rows: 0,
            failure: None,
            peak_buffered: 0,
        };
        let file = File::create(&writer.partial).map_err(OutputError::io(path))?;
        let mut out = BufWriter::with_capacity(BUFFER, file);
        let header = writeln!(out, "{CSV_HEADER}");
        writer.out = Some(out);
        header.map_err(|e| writer.fail(e))?;
        Ok(writer)
    }

    /// The rows that follow belong to variant `name`.
    pub fn begin_variant(&mut self, name: &str) {
        self.variant = quote(name).into_owned();
    }

    /// Writes one request's row. The first write that fails removes the
    /// partial file and returns the error; later ones do nothing.
    pub fn write(&mut self, r: &RequestRecord) -> Result<(), OutputError> {
        let Some(out) = &mut self.out else {
            return Ok(());
        };
        let written = write_row(out, &self.variant, r, self.slow_threshold);
        self.peak_buffered = self.peak_buffered.max(out.buffer().len());
        match written {
            Ok(()) => {
                self.rows += 1;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The most bytes the writer held before they reached the file.
    pub fn peak_buffered(&self) -> usize {
        self.peak_buffered
    }

    /// Whether a write failed (the file will be absent).
    pub fn failed(&self) -> bool {
        self.failure.is_some()
    }

    /// Syncs the rows and renames the partial file to `requests.csv`; an
    /// earlier failure is returned instead (and nothing is left behind).
    pub fn finish(mut self) -> Result<(), OutputError> {
        if let Some(e) = self.failure.take() {
            return Err(self.error(e));
        }
        let Some(mut out) = self.out.take() else {
            return Ok(());
        };
        let done = out
            .flush()
            .and_then(|()| out.get_ref().sync_data())
            .and_then(|()| std::fs::rename(&self.partial, &self.path));
        drop(out);
        done.map_err(|e| {
            let _ = std::fs::remove_file(&self.partial);
            self.error(e)
        })
    }

    fn fail(&mut self, e: std::io::Error) -> OutputError {
        self.out = None;
        let _ = std::fs::remove_file(&self.partial);
        let error = self.error(std::io::Error::new(e.kind(), e.to_string()));
        self.failure = Some(e);
        error
    }

    fn error(&self, source: std::io::Error) -> OutputError {
        OutputError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

impl Drop for RequestsWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// A [`RequestsWriter`] on a thread of its own, fed through a bounded
/// queue: the rows are formatted and written off the load generator's
/// thread (which sends the requests), and memory holds at most
/// [`SPOOL_QUEUE`] records waiting (a disk slower than the load makes
/// [`write`] wait instead of piling records up).
///
/// [`write`]: RequestsSpool::write
pub struct RequestsSpool {
    queue: Option<SyncSender<Spooled>>,
    thread: Option<JoinHandle<RequestsWriter>>,
    path: PathBuf,
    queued: Arc<AtomicUsize>,
    peak_queued: Arc<AtomicUsize>,
    peak_buffered: Arc<AtomicUsize>,
}

/// Records waiting for the spool's thread, at most.
pub const SPOOL_QUEUE: usize = 4096;

enum Spooled {
    Variant(String),
    Record(RequestRecord),
}

impl std::fmt::Debug for RequestsSpool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestsSpool")
            .field("path", &self.path)
            .finish()
    }
}

impl RequestsSpool {
    /// Moves `writer` to a thread of its own. `on_failure` is called there,
    /// once, when a write fails, with the number of variants begun so far
    /// and the error (later rows are dropped).
    pub fn start(
        mut writer: RequestsWriter,
        on_failure: impl FnOnce(usize, OutputError) + Send + 'static,
    ) -> Result<RequestsSpool, OutputError> {
        let (queue, rows) = std::sync::mpsc::sync_channel(SPOOL_QUEUE);
        let path = writer.path.clone();
        let queued = Arc::new(AtomicUsize::new(0));
        let peak_queued = Arc::new(AtomicUsize::new(0));
        let peak_buffered = Arc::new(AtomicUsize::new(0));
        let (waiting, buffered) = (Arc::clone(&queued), Arc::clone(&peak_buffered));
        let thread = std::thread::Builder::new()
            .name("requests.csv".to_owned())
            .spawn(move || {
                let mut on_failure = Some(on_failure);
                let mut variants = 0;
                let mut turns = Turns::new();
                for row in rows {
                    // Behind by half its queue, it writes without
                    // offering its core until it has caught up.
                    if waiting.load(Ordering::Relaxed) < SPOOL_QUEUE / 2 {
                        turns.tick();
                    }
                    match row {
                        Spooled::Variant(name) => {
                            variants += 1;
                            writer.begin_variant(&name);
                        }
                        Spooled::Record(r) => {
                            waiting.fetch_sub(1, Ordering::Relaxed);
                            if let Err(e) = writer.write(&r)
                                && let Some(tell) = on_failure.take()
                            {
                                tell(variants, e);
                            }
                            buffered.fetch_max(writer.peak_buffered(), Ordering::Relaxed);
                        }
                    }
                }
                writer
            })
            .map_err(OutputError::io(&path))?;
        Ok(RequestsSpool {
            queue: Some(queue),
            thread: Some(thread),
            path,
            queued,
            peak_queued,
            peak_buffered,
        })
    }

    /// The rows that follow belong to variant `name`.
    pub fn begin_variant(&self, name: &str) {
        if let Some(queue) = &self.queue {
            // The thread only ends when the queue closes.
            let _ = queue.send(Spooled::Variant(name.to_owned()));
        }
    }

    /// Queues one request's row; waits while the queue is full.
    pub fn write(&self, r: RequestRecord) {
        if let Some(queue) = &self.queue {
            let waiting = self.queued.fetch_add(1, Ordering::Relaxed) + 1;
            self.peak_queued.fetch_max(waiting, Ordering::Relaxed);
            let _ = queue.send(Spooled::Record(r));
        }
    }

    /// The most records held at once between [`write`] and the file: the
    /// queue's [`SPOOL_QUEUE`], plus one being handed over and one being
    /// written, at most.
    ///
    /// [`write`]: RequestsSpool::write
    pub fn peak_queued(&self) -> usize {
        self.peak_queued.load(Ordering::Relaxed)
    }

    /// The most bytes the writer held before they reached the file.
    pub fn peak_buffered(&self) -> usize {
        self.peak_buffered.load(Ordering::Relaxed)
    }

    /// Waits for every queued row to be written; the writer, to finish.
    pub fn finish(mut self) -> Result<RequestsWriter, OutputError> {
        self.queue = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(writer)) => Ok(writer),
            _ => Err(OutputError::Io {
                path: self.path.clone(),
                source: std::io::Error::other("the thread writing it panicked"),
            }),
        }
    }
}

impl Drop for RequestsSpool {
    /// Unfinished: the writer's thread ends, removing the partial file.
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn write_row(
    out: &mut impl Write,
    variant: &str,
    r: &RequestRecord,
    slow_threshold: Duration,
) -> std::io::Result<()> {
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
    let hops: Vec<String> = r
        .path
        .iter()
        .map(|h| {
            format!(
                "{}/{}/{}/{}/{}/{}",
                micros3(Duration::from_nanos(h.total_ns)),
                micros3(Duration::from_nanos(h.queue_wait_ns)),
                h.parent,
                h.transport,
                h.extra_attempts,
                micros3(Duration::from_nanos(h.slot_wait_ns)),
            )
        })
        .collect();
    let calls: Vec<String> = r.path.iter().map(|h| calls_entry(&h.calls)).collect();
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
    let error = match &r.outcome {
        Outcome::Error { message, .. } => message.as_str(),
        _ => "",
    };
    writeln!(
        out,
        "{variant},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
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
        u8::from(r.retried()),
        quote(&hops.join(";")),
        quote(error),
        quote(&calls.join(";")),
        quote(&attempts_entry(&r.attempts)),
        r.stream
            .map(|p| format!("{}/{}", p.stream, p.message))
            .unwrap_or_default(),
    )
}

/// One path record's calls: `hop@call_us:attempts`, joined by `|`.
fn calls_entry(calls: &[CallTiming]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|c| {
            format!(
                "{}@{}:{}",
                c.hop,
                micros3(Duration::from_nanos(c.call_ns)),
                attempts_entry(&c.attempts)
            )
        })
        .collect();
    calls.join("|")
}

/// Attempts: `start_us+took_us` and the end, joined by `/`.
fn attempts_entry(attempts: &[AttemptTiming]) -> String {
    let attempts: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "{}+{}{}",
                micros3(Duration::from_nanos(a.start_ns)),
                micros3(Duration::from_nanos(a.took_ns)),
                end_label(a.end())
            )
        })
        .collect();
    attempts.join("/")
}

/// How an attempt ended, as `requests.csv` spells it.
fn end_label(end: AttemptEnd) -> &'static str {
    match end {
        AttemptEnd::Ok => "ok",
        AttemptEnd::Failed => "failed",
        AttemptEnd::Cancelled => "cancelled",
        AttemptEnd::Unspecified => "unspecified",
    }
}

/// Parses [`attempts_entry`]'s output back.
fn parse_attempts(field: &str) -> Option<Vec<AttemptTiming>> {
    let ns = |f: &str| parse_micros3(f).map(tailmesh_units::nanos);
    field
        .split('/')
        .filter(|a| !a.is_empty())
        .map(|a| {
            let (start, rest) = a.split_once('+')?;
            let at = rest.find(|c: char| c.is_ascii_alphabetic())?;
            let (took, end) = rest.split_at(at);
            let end = [
                AttemptEnd::Ok,
                AttemptEnd::Failed,
                AttemptEnd::Cancelled,
                AttemptEnd::Unspecified,
            ]
            .into_iter()
            .find(|e| end_label(*e) == end)?;
            Some(AttemptTiming {
                start_ns: ns(start)?,
                took_ns: ns(took)?,
                end: end as i32,
            })
        })
        .collect()
}

/// Parses [`calls_entry`]'s output back.
fn parse_calls(field: &str) -> Option<Vec<CallTiming>> {
    field
        .split('|')
        .filter(|c| !c.is_empty())
        .map(|c| {
            let (hop, rest) = c.rsplit_once('@')?;
            let (call, attempts) = rest.split_once(':')?;
            Some(CallTiming {
                hop: hop.to_owned(),
                call_ns: tailmesh_units::nanos(parse_micros3(call)?),
                attempts: parse_attempts(attempts)?,
            })
        })
        .collect()
}

/// `d` in microseconds with three decimals, e.g. `1234.567`.
pub fn micros3(d: Duration) -> String {
    let ns = d.as_nanos();
    format!("{}.{:03}", ns / 1_000, ns % 1_000)
}

/// `field` quoted per RFC 4180 when it needs to be.
pub fn quote(field: &str) -> Cow<'_, str> {
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

/// Reads a `requests.csv` back whole: each row's variant and its record
/// (see [`for_each_request`], which keeps none).
pub fn read_requests_csv(path: &Path) -> Result<Vec<(String, RequestRecord)>, OutputError> {
    let mut out = Vec::new();
    for_each_request(path, |variant, record| {
        out.push((variant.to_owned(), record))
    })?;
    Ok(out)
}

/// Reads a `requests.csv` one row at a time, handing each row's variant
/// and record to `each`; memory holds one row. Version 5 files give back
/// every field of the record, version 4 ones all but the stream; version 3 ones lack the slot wait, the
/// calls' and the generator's attempts (zero or empty); older ones also
/// the path records' total, queue wait, parent, transport and extra
/// attempts, and errors' messages. The cause columns are derived, and not
/// read.
pub fn for_each_request(
    path: &Path,
    mut each: impl FnMut(&str, RequestRecord),
) -> Result<(), OutputError> {
    let file = File::open(path).map_err(OutputError::io(path))?;
    let mut rows = Rows {
        input: BufReader::new(file),
        line: 0,
        text: String::new(),
    };
    let bad = |line: usize, what: String| OutputError::Parse {
        path: path.to_path_buf(),
        line,
        what,
    };
    let fields = match rows.next().map_err(OutputError::io(path))? {
        Some((_, header)) if header.join(",") == CSV_HEADER => 18,
        Some((_, header)) if header.join(",") == CSV_HEADER_V4 => 17,
        Some((_, header)) if header.join(",") == CSV_HEADER_V3 => 15,
        Some((_, header)) if header.join(",") == CSV_HEADER_V2 => 12,
        Some((_, header)) if header.join(",") == CSV_HEADER_V1 => 10,
        _ => return Err(bad(1, format!("the first line must be {CSV_HEADER}"))),
    };
    while let Some((line, row)) = rows.next().map_err(OutputError::io(path))? {
        if row.len() != fields {
            return Err(bad(
                line,
                format!("{} fields, expected {fields}", row.len()),
            ));
        }
        let (variant, record) = parse_row(row, &|what| bad(line, what))?;
        each(&variant, record);
    }
    Ok(())
}

/// The rows of a CSV file, one at a time (a quoted field may span lines).
struct Rows<R> {
    input: R,
    /// Lines read so far.
    line: usize,
    text: String,
}

impl<R: BufRead> Rows<R> {
    /// The next row and the line it starts on.
    fn next(&mut self) -> std::io::Result<Option<(usize, Vec<String>)>> {
        self.text.clear();
        let first = self.line + 1;
        loop {
            let n = self.input.read_line(&mut self.text)?;
            if n == 0 {
                break;
            }
            self.line += 1;
            // Inside quotes while the quotes so far are odd.
            if self.text.bytes().filter(|&b| b == b'"').count() % 2 == 0 {
                break;
            }
        }
        if self.text.is_empty() {
            return Ok(None);
        }
        Ok(split_rows(&self.text)
            .into_iter()
            .next()
            .map(|row| (first, row)))
    }
}

/// One row's variant and record; `bad` makes the error for what is wrong.
fn parse_row(
    mut row: Vec<String>,
    bad: &dyn Fn(String) -> OutputError,
) -> Result<(String, RequestRecord), OutputError> {
    let stream = match (row.len() == 18).then(|| row.split_off(17)) {
        Some(field) => {
            parse_place(&field[0]).ok_or_else(|| bad(format!("stream {:?}", field[0])))?
        }
        None => None,
    };
    let calls_attempts = (row.len() == 17).then(|| row.split_off(15));
    let (retried_hops_error, row) = if row.len() == 15 {
        let tail = row.split_off(12);
        (Some(tail), row)
    } else {
        (None, row)
    };
    let mut row = row;
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
        .map_err(|r| bad(format!("{} fields, expected 10", r.len())))?;
    let id = id
        .parse::<u64>()
        .map_err(|e| bad(format!("id {id:?}: {e}")))?;
    let time = |field: &str| parse_micros3(field).ok_or_else(|| bad(format!("time {field:?}")));
    let ns = |field: &str| time(field).map(tailmesh_units::nanos);
    let slow: Vec<&str> = slow_hops.split(';').filter(|s| !s.is_empty()).collect();
    let mut path = Vec::new();
    for entry in path_field.split(';').filter(|s| !s.is_empty()) {
        let mut parts = entry.rsplitn(3, '/');
        let (Some(service), Some(replica), Some(hop)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad(format!("path entry {entry:?}")));
        };
        path.push(HopRecord {
            hop: hop.to_string(),
            replica: replica
                .parse()
                .map_err(|e| bad(format!("replica in {entry:?}: {e}")))?,
            service_ns: ns(service)?,
            slow: slow.contains(&hop),
            ..Default::default()
        });
    }
    let mut outcome =
        Outcome::from_label(&status).ok_or_else(|| bad(format!("status {status:?}")))?;
    if let Some(tail) = retried_hops_error {
        let [_retried, hops, error] =
            <[String; 3]>::try_from(tail).map_err(|_| bad("the v3 columns".to_owned()))?;
        let entries: Vec<&str> = hops.split(';').filter(|s| !s.is_empty()).collect();
        if entries.len() != path.len() {
            return Err(bad(format!(
                "hops {hops:?}: {} entries for {} path records",
                entries.len(),
                path.len()
            )));
        }
        let v4 = calls_attempts.is_some();
        for (h, entry) in path.iter_mut().zip(entries) {
            let parts: Vec<&str> = entry.split('/').collect();
            let (total, queue, parent, transport, extra, slot) = match parts[..] {
                [total, queue, parent, transport, extra] if !v4 => {
                    (total, queue, parent, transport, extra, None)
                }
                [total, queue, parent, transport, extra, slot] if v4 => {
                    (total, queue, parent, transport, extra, Some(slot))
                }
                _ => return Err(bad(format!("hops entry {entry:?}"))),
            };
            if let Some(slot) = slot {
                h.slot_wait_ns = ns(slot)?;
            }
            h.total_ns = ns(total)?;
            h.queue_wait_ns = ns(queue)?;
            h.parent = parent.to_owned();
            h.transport = transport.to_owned();
            h.extra_attempts = extra
                .parse()
                .map_err(|e| bad(format!("extra attempts in {entry:?}: {e}")))?;
        }
        if let Outcome::Error { message, .. } = &mut outcome {
            *message = error;
        }
    }
    let mut attempts = Vec::new();
    if let Some(tail) = calls_attempts {
        let [calls, generator] =
            <[String; 2]>::try_from(tail).map_err(|_| bad("the v4 columns".to_owned()))?;
        // One entry per path record, empty ones included; none without a path.
        let entries: Vec<&str> = match path.len() {
            0 if calls.is_empty() => Vec::new(),
            _ => calls.split(';').collect(),
        };
        if entries.len() != path.len() {
            return Err(bad(format!(
                "calls {calls:?}: {} entries for {} path records",
                entries.len(),
                path.len()
            )));
        }
        for (h, entry) in path.iter_mut().zip(entries) {
            h.calls = parse_calls(entry).ok_or_else(|| bad(format!("calls entry {entry:?}")))?;
        }
        attempts =
            parse_attempts(&generator).ok_or_else(|| bad(format!("attempts {generator:?}")))?;
    }
    let record = RequestRecord {
        id,
        intended: time(&intended)?,
        start: time(&start)?,
        end: time(&end)?,
        outcome,
        path,
        extra_attempts: extra
            .parse()
            .map_err(|e| bad(format!("extra_attempts {extra:?}: {e}")))?,
        attempts,
        stream,
    };
    Ok((variant, record))
}

/// A `stream` field: empty, or `stream/message`; `None` inside when it is
/// neither.
fn parse_place(field: &str) -> Option<Option<StreamPlace>> {
    if field.is_empty() {
        return Some(None);
    }
    let (stream, message) = field.split_once('/')?;
    Some(Some(StreamPlace {
        stream: stream.parse().ok()?,
        message: message.parse().ok()?,
    }))
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
    fn version_2_files_still_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        std::fs::write(
            &path,
            format!(
                "{CSV_HEADER_V2}\nbase,3,0.000,1.000,9.000,9.000,ok,a,a/1/5.000,2,injected:a,\"injected:a=5.000ms\"\n"
            ),
        )
        .expect("write");
        let back = read_requests_csv(&path).expect("a version 2 file reads");
        assert_eq!(back.len(), 1);
        let r = &back[0].1;
        assert_eq!((r.id, r.extra_attempts), (3, 2));
        assert_eq!(
            (r.path[0].hop.as_str(), r.path[0].replica, r.path[0].slow),
            ("a", 1, true)
        );
        assert_eq!(r.path[0].service_ns, 5_000);
    }

    #[test]
    fn records_read_back_as_written() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mut mixed = mixed_records();
        // Every field a path record has, and a retry at a hop.
        mixed[3].path[1].queue_wait_ns = 1_234_567;
        mixed[3].path[1].total_ns = 9_000_001;
        mixed[3].path[1].extra_attempts = 2;
        mixed[3].path[1].parent = "a".to_owned();
        mixed[3].path[1].transport = "pull".to_owned();
        mixed[3].path[1].slot_wait_ns = 1_000_001;
        // A hedged call and a plain one from one hop, none from another.
        mixed[3].path[2].calls = vec![hedged_call("b"), plain_call("c")];
        mixed[3].path[0].calls = vec![plain_call("x")];
        mixed[4].extra_attempts = 1;
        mixed[4].attempts = hedged_call("a").attempts;
        mixed[5].attempts = plain_call("a").attempts;
        // A failed request: no path, yet the generator's attempts.
        let last = mixed.len() - 1;
        mixed[last].attempts = hedged_call("a").attempts;
        // Messages of streams.
        mixed[1].stream = Some(StreamPlace {
            stream: 12,
            message: 0,
        });
        mixed[last].stream = Some(StreamPlace {
            stream: 3,
            message: 499,
        });
        write_requests_csv(&path, &[("a, \"b\"", &mixed)], MS15).expect("written");
        let back = read_requests_csv(&path).expect("read back");
        assert_eq!(back.len(), mixed.len());
        for ((variant, got), want) in back.iter().zip(&mixed) {
            assert_eq!(variant, "a, \"b\"");
            // Version 5 keeps every field, error messages included.
            assert_eq!(got, want);
        }
        std::fs::write(&path, "variant,id\nx,1\n").expect("write");
        assert!(matches!(
            read_requests_csv(&path),
            Err(OutputError::Parse { line: 1, .. })
        ));
        let text =
            format!("{CSV_HEADER}\nbase,1,0.000,0.000,1.000,1.000,ok,,a/0/1.000,0,,,0,,,,,\n");
        std::fs::write(&path, text).expect("write");
        assert!(
            matches!(
                read_requests_csv(&path),
                Err(OutputError::Parse { line: 2, .. })
            ),
            "a path record without its hops entry"
        );
    }

    /// A call whose first attempt was slow: a hedge went after 10 ms and
    /// answered 5 ms later; the first, cancelled then, ran 15 ms.
    fn hedged_call(hop: &str) -> CallTiming {
        let ms = |n: u64| n * 1_000_000;
        CallTiming {
            hop: hop.to_owned(),
            call_ns: ms(15) + 1,
            attempts: vec![
                AttemptTiming {
                    start_ns: 0,
                    took_ns: ms(15) + 1,
                    end: AttemptEnd::Cancelled as i32,
                },
                AttemptTiming {
                    start_ns: ms(10),
                    took_ns: ms(5) + 1,
                    end: AttemptEnd::Ok as i32,
                },
            ],
        }
    }

    /// A call with one attempt, which failed.
    fn plain_call(hop: &str) -> CallTiming {
        CallTiming {
            hop: hop.to_owned(),
            call_ns: 2_500,
            attempts: vec![AttemptTiming {
                start_ns: 0,
                took_ns: 2_500,
                end: AttemptEnd::Failed as i32,
            }],
        }
    }

    #[test]
    fn calls_and_attempts_are_written_compactly_per_path_record() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mut record = ok_records()[0].clone();
        assert_eq!(record.path.len(), 3);
        record.path[1].calls = vec![hedged_call("c")];
        record.path[1].slot_wait_ns = 7_000;
        record.path[2].calls = vec![plain_call("b"), hedged_call("d")];
        record.attempts = plain_call("a").attempts;
        write_requests_csv(&path, &[("base", &[record])], MS15).expect("written");
        let rows = parse(&std::fs::read_to_string(&path).expect("readable"));
        assert!(
            rows.iter().all(|r| r.len() == 18),
            "every row has 18 fields"
        );
        let row = &rows[1];
        assert_eq!(
            row[13],
            "20300.500/0.000//push/0/0.000;20300.500/0.000//push/0/7.000;20300.500/0.000//push/0/0.000"
        );
        assert_eq!(
            row[15],
            ";c@15000.001:0.000+15000.001cancelled/10000.000+5000.001ok;\
             b@2.500:0.000+2.500failed|d@15000.001:0.000+15000.001cancelled/10000.000+5000.001ok"
        );
        assert_eq!(row[16], "0.000+2.500failed");
    }

    #[test]
    fn version_3_files_still_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        std::fs::write(
            &path,
            format!(
                "{CSV_HEADER_V3}\nbase,3,0.000,1.000,9.000,9.000,ok,,b/0/2.000;a/1/5.000,1,,,1,\
                 3.000/1.000/a/pull/0;8.000/0.500//push/1,\n"
            ),
        )
        .expect("write");
        let back = read_requests_csv(&path).expect("a version 3 file reads");
        let r = &back[0].1;
        assert_eq!((r.id, r.extra_attempts, r.attempts.len()), (3, 1, 0));
        assert_eq!(r.path[1].queue_wait_ns, 500);
        assert_eq!(r.path[1].extra_attempts, 1);
        assert!(
            r.path
                .iter()
                .all(|h| h.slot_wait_ns == 0 && h.calls.is_empty())
        );
        // A v3 hops entry in a v4 file lacks its slot wait.
        let v4 = format!(
            "{CSV_HEADER_V4}\nbase,3,0.000,1.000,9.000,9.000,ok,,a/1/5.000,0,,,0,8.000/0.500//push/0,,\n"
        );
        std::fs::write(&path, v4).expect("write");
        assert!(matches!(
            read_requests_csv(&path),
            Err(OutputError::Parse { line: 2, .. })
        ));
    }

    #[test]
    fn version_4_files_still_read_and_a_bad_stream_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let row = "base,3,0.000,1.000,9.000,9.000,ok,,a/1/5.000,0,,,0,8.000/0.500//push/0/0.000,,,";
        std::fs::write(&path, format!("{CSV_HEADER_V4}\n{row}\n")).expect("write");
        let back = read_requests_csv(&path).expect("a version 4 file reads");
        assert_eq!((back[0].1.id, back[0].1.stream), (3, None));
        std::fs::write(&path, format!("{CSV_HEADER}\n{row},7/x\n")).expect("write");
        match read_requests_csv(&path) {
            Err(OutputError::Parse { line: 2, what, .. }) => {
                assert_eq!(what, "stream \"7/x\"");
            }
            other => panic!("a bad stream field: {other:?}"),
        }
    }

    #[test]
    fn the_retried_column_marks_retries_and_hedges_at_any_hop() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mut records = ok_records()[..3].to_vec();
        records[1].extra_attempts = 1;
        records[2].path[2].extra_attempts = 1;
        write_requests_csv(&path, &[("base", &records)], MS15).expect("written");
        let rows = parse(&std::fs::read_to_string(&path).expect("readable"));
        let retried: Vec<&str> = rows[1..].iter().map(|r| r[12].as_str()).collect();
        assert_eq!(retried, ["0", "1", "1"]);
    }

    #[test]
    fn a_failed_write_leaves_no_file_and_is_reported_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let records = ok_records();
        let mut writer = RequestsWriter::create(&path, MS15).expect("created");
        writer.begin_variant("base");
        writer.write(&records[0]).expect("a row");
        let partial = dir.path().join(".requests.csv.partial");
        assert!(partial.is_file(), "rows go to the partial file");
        assert!(!path.exists(), "requests.csv appears only when finished");
        // As a full disk would: the file is gone from under the writer.
        let e = writer.fail(std::io::Error::from_raw_os_error(28));
        assert!(e.to_string().contains("requests.csv"), "{e}");
        assert!(writer.failed() && !partial.exists());
        writer.write(&records[1]).expect("later writes do nothing");
        let e = writer.finish().expect_err("the failure comes back");
        assert!(e.to_string().contains("No space left"), "{e}");
        assert!(!path.exists() && !partial.exists());

        // A writer dropped unfinished leaves nothing either.
        let mut writer = RequestsWriter::create(&path, MS15).expect("created");
        writer.write(&records[0]).expect("a row");
        drop(writer);
        assert!(!path.exists() && !partial.exists());
    }

    #[test]
    fn the_spool_writes_every_row_in_order_off_the_callers_thread() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let mixed = mixed_records();
        let writer = RequestsWriter::create(&path, MS15).expect("created");
        let spool = RequestsSpool::start(writer, |_, e| panic!("no failure expected: {e}"))
            .expect("started");
        for (name, records) in [("push", &mixed[..]), ("pull", &mixed[..10])] {
            spool.begin_variant(name);
            for _ in 0..10 {
                for r in records {
                    spool.write(r.clone());
                }
            }
        }
        assert!(
            spool.peak_queued() <= SPOOL_QUEUE + 2,
            "{}",
            spool.peak_queued()
        );
        let writer = spool.finish().expect("the thread ended");
        assert_eq!(writer.rows(), 10 * (mixed.len() as u64 + 10));
        writer.finish().expect("renamed into place");
        let back = read_requests_csv(&path).expect("read back");
        assert_eq!(back.len(), 10 * (mixed.len() + 10));
        assert_eq!(back[0].1, mixed[0]);
        assert_eq!(back[mixed.len()].1, mixed[0], "rows keep their order");
        assert_eq!(back.last().map(|(v, _)| v.as_str()), Some("pull"));
    }

    #[test]
    fn a_spool_whose_disk_fills_says_so_once_and_leaves_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let records = ok_records();
        let mut writer = RequestsWriter::create(&path, MS15).expect("created");
        // Every write to /dev/full fails with ENOSPC, as on a full disk.
        let full = File::options()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        writer.out = Some(BufWriter::with_capacity(BUFFER, full));
        let (told_tx, told) = std::sync::mpsc::channel();
        let spool = RequestsSpool::start(writer, move |variants, e| {
            let _ = told_tx.send((variants, e.to_string()));
        })
        .expect("started");
        spool.begin_variant("base");
        for _ in 0..100 {
            for r in &records {
                spool.write(r.clone());
            }
        }
        let writer = spool.finish().expect("the thread ended");
        let told: Vec<(usize, String)> = told.try_iter().collect();
        assert_eq!(told.len(), 1, "told once: {told:?}");
        assert_eq!(told[0].0, 1, "during the first variant");
        assert!(told[0].1.contains("requests.csv"), "{}", told[0].1);
        assert!(writer.failed());
        assert!(writer.finish().is_err());
        assert!(!path.exists() && !dir.path().join(".requests.csv.partial").exists());
    }

    #[test]
    fn the_writer_buffers_a_bounded_amount_however_many_rows() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("requests.csv");
        let records = ok_records();
        let mut writer = RequestsWriter::create(&path, MS15).expect("created");
        writer.begin_variant("base");
        for _ in 0..20 {
            for r in &records {
                writer.write(r).expect("a row");
            }
        }
        assert_eq!(writer.rows(), 20_000);
        assert!(
            writer.peak_buffered() <= BUFFER,
            "{}",
            writer.peak_buffered()
        );
        writer.finish().expect("finished");
        let size = std::fs::metadata(&path).expect("written").len();
        assert!(
            size > 10 * BUFFER as u64,
            "{size} bytes: the rows reached the file"
        );
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
            rows.iter().all(|r| r.len() == 18),
            "every row has 18 fields"
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
        assert_eq!(r0[12], "0", "no retry");
        assert_eq!(
            r0[13],
            "20300.500/0.000//push/0/0.000;20300.500/0.000//push/0/0.000;20300.500/0.000//push/0/0.000"
        );
        assert_eq!((r0[15].as_str(), r0[16].as_str()), (";;", ""));
        // Request 111: slow nowhere.
        assert_eq!((rows[112][10].as_str(), rows[112][11].as_str()), ("", ""));
        assert_eq!(rows[112][7], "");
        assert_eq!(rows[112][8], "c/1/300.000;b/1/300.000;a/1/300.000");
        // Failures: status label, no path.
        let timeout = &rows[1 + 1000];
        assert_eq!((timeout[6].as_str(), timeout[8].as_str()), ("timeout", ""));
        assert_eq!(rows[1 + 1005][6], "unavailable");
        assert_eq!(
            rows[1 + 1005][14],
            "hop \"b\" replica 1: connect 127.0.0.1:1005: connection refused"
        );
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

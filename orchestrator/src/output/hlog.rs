//! `<variant>.hlog`: a variant's latency per interval as an HdrHistogram
//! interval log (format version 1.3, the one HdrHistogram's
//! `HistogramLogReader` and log processors read), written while the run
//! goes, one interval at a time as it closes, on a thread of its own.
//!
//! Layout, as HdrHistogram's Java writer lays it out:
//!
//! ```text
//! #[Histogram log format version 1.3]
//! #tailmesh 0.1.0 variant base: ...
//! #[StartTime: 1764650000.123 (seconds since epoch)]
//! #[BaseTime: 1764650000.123 (seconds since epoch)]
//! "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
//! #[MaxValueDivisor: 1000.000]
//! 0.000,1.000,12.345,HISTFAAAA...            end to end
//! Tag=hop.a,0.000,1.000,11.002,HISTFAAAA...  hop a, its downstream included
//! ```
//!
//! - StartTime and BaseTime are the wall-clock time of the end of warmup,
//!   so each interval's timestamp is seconds on the measured clock (the
//!   clock of requests.csv), with no guessing by the reader.
//! - Values are microseconds; the max column is in milliseconds (the
//!   divisor line says so), as in the `.hgrm` files.
//! - Every interval from 0 to the end of the measured phase is written,
//!   empty ones included; the last one is only as long as what was left.
//! - Like requests.csv, the file is written into a hidden
//!   `.<variant>.hlog.partial` and renamed into place with the run's other
//!   files: it is whole or absent. A write that fails (a full disk) removes
//!   it and is told once, so the run stops the load as for requests.csv.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::SystemTime;

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriter, IntervalLogWriterBuilder, Tag};

use super::OutputError;
use crate::analysis::latency_intervals::{ClosedInterval, IntervalHists};

/// Intervals waiting for the writer's thread, at most: a disk slower than
/// the intervals makes [`HlogSpool::write`] wait.
pub(crate) const HLOG_QUEUE: usize = 4;

/// The legend line HdrHistogram's Java writer puts before the intervals
/// (readers skip it).
const LEGEND: &str =
    "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n";

/// What the max column is divided by: µs to ms.
const US_PER_MS: f64 = 1_000.0;

/// The tag of hop `hop`'s histograms.
pub(crate) fn hop_tag(hop: &str) -> String {
    format!("hop.{hop}")
}

/// The file name of `variant`'s log.
pub fn file_name(variant: &str) -> String {
    format!("{variant}.hlog")
}

enum Message {
    Begin {
        path: PathBuf,
        variant: String,
        hops: Vec<String>,
    },
    Start(SystemTime),
    Interval(ClosedInterval),
    End,
}

/// One variant's log, written to its partial file during the run;
/// [`HlogFile::finish`] renames it into place.
#[derive(Debug)]
pub(crate) struct HlogFile {
    path: PathBuf,
    partial: PathBuf,
    failure: Option<String>,
    renamed: bool,
}

impl HlogFile {
    /// Renames the partial file to `<variant>.hlog`; a write that failed
    /// during the run is this error instead (and nothing is left behind).
    pub(crate) fn finish(mut self) -> Result<(), OutputError> {
        if let Some(why) = self.failure.take() {
            return Err(OutputError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(why),
            });
        }
        self.renamed = true;
        std::fs::rename(&self.partial, &self.path).map_err(|source| {
            let _ = std::fs::remove_file(&self.partial);
            OutputError::Io {
                path: self.path.clone(),
                source,
            }
        })
    }

    /// The log's path once renamed.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HlogFile {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// The `.hlog` writer on a thread of its own, fed through a bounded queue:
/// serializing and compressing stay off the load generator's thread, and
/// each interval's histograms come back (through
/// [`HlogSpool::returned`]) to be reused, never cloned.
pub(crate) struct HlogSpool {
    queue: Option<SyncSender<Message>>,
    returned: Receiver<IntervalHists>,
    thread: Option<JoinHandle<Vec<HlogFile>>>,
}

impl std::fmt::Debug for HlogSpool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HlogSpool").finish_non_exhaustive()
    }
}

impl HlogSpool {
    /// Starts the thread. `on_failure` is called there, once, when a write
    /// fails, with the number of variants begun so far and the error.
    pub(crate) fn start(
        on_failure: impl FnOnce(usize, OutputError) + Send + 'static,
    ) -> Result<HlogSpool, OutputError> {
        let (queue, messages) = std::sync::mpsc::sync_channel(HLOG_QUEUE);
        let (back, returned) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("hlog".to_owned())
            .spawn(move || run(&messages, &back, on_failure))
            .map_err(OutputError::io(Path::new(".hlog")))?;
        Ok(HlogSpool {
            queue: Some(queue),
            returned,
            thread: Some(thread),
        })
    }

    /// The intervals that follow are `variant`'s, over `hops`, into `path`.
    pub(crate) fn begin_variant(&self, path: &Path, variant: &str, hops: Vec<String>) {
        self.send(Message::Begin {
            path: path.to_owned(),
            variant: variant.to_owned(),
            hops,
        });
    }

    /// The wall-clock time of the current variant's end of warmup (the
    /// log's StartTime and BaseTime).
    pub(crate) fn measuring_from(&self, at: SystemTime) {
        self.send(Message::Start(at));
    }

    /// Queues one closed interval; waits while the queue is full.
    pub(crate) fn write(&self, interval: ClosedInterval) {
        self.send(Message::Interval(interval));
    }

    /// Histograms the thread is done with, one at a time.
    pub(crate) fn returned(&self) -> Option<IntervalHists> {
        self.returned.try_recv().ok()
    }

    /// The current variant's log is complete.
    pub(crate) fn end_variant(&self) {
        self.send(Message::End);
    }

    /// Waits for every queued interval to be written; each variant's log,
    /// in the order begun.
    pub(crate) fn finish(mut self) -> Result<Vec<HlogFile>, OutputError> {
        self.queue = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(files)) => Ok(files),
            _ => Err(OutputError::Io {
                path: PathBuf::from(".hlog"),
                source: std::io::Error::other("the thread writing it panicked"),
            }),
        }
    }

    fn send(&self, message: Message) {
        if let Some(queue) = &self.queue {
            // The thread only ends when the queue closes.
            let _ = queue.send(message);
        }
    }
}

impl Drop for HlogSpool {
    /// Unfinished: the thread ends, its partial files are removed.
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: one log per `Begin`, until the queue closes.
fn run(
    messages: &Receiver<Message>,
    back: &Sender<IntervalHists>,
    on_failure: impl FnOnce(usize, OutputError),
) -> Vec<HlogFile> {
    let mut on_failure = Some(on_failure);
    let mut files = Vec::new();
    let mut next = messages.recv().ok();
    while let Some(message) = next.take() {
        match message {
            Message::Begin {
                path,
                variant,
                hops,
            } => {
                let begun = files.len() + 1;
                let mut tell = |e: OutputError| {
                    if let Some(tell) = on_failure.take() {
                        tell(begun, e);
                    }
                };
                let (file, after) = write_variant(messages, back, path, &variant, &hops, &mut tell);
                files.push(file);
                next = after;
            }
            Message::Interval(c) => give_back(back, c),
            Message::Start(_) | Message::End => {}
        }
        if next.is_none() {
            next = messages.recv().ok();
        }
    }
    files
}

fn give_back(back: &Sender<IntervalHists>, c: ClosedInterval) {
    if let Some(h) = c.hists {
        let _ = back.send(h);
    }
}

/// Writes one variant's log from the queue until its `End` (or the next
/// `Begin`, returned, or the queue's close).
fn write_variant(
    messages: &Receiver<Message>,
    back: &Sender<IntervalHists>,
    path: PathBuf,
    variant: &str,
    hops: &[String],
    tell: &mut dyn FnMut(OutputError),
) -> (HlogFile, Option<Message>) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut file = HlogFile {
        partial: path.with_file_name(format!(".{name}.partial")),
        path,
        failure: None,
        renamed: false,
    };
    let mut next = None;
    let written = File::create(&file.partial)
        .map_err(OutputError::io(&file.path))
        .and_then(|f| {
            let mut out = BufWriter::new(f);
            write_log(
                &mut out, &file.path, messages, back, variant, hops, &mut next,
            )?;
            out.flush()
                .and_then(|()| out.get_ref().sync_data())
                .map_err(OutputError::io(&file.path))
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&file.partial);
        file.failure = Some(e.to_string());
        tell(e);
        // The rest of the variant's intervals are dropped, their
        // histograms given back.
        while next.is_none() {
            match messages.recv() {
                Ok(Message::Interval(c)) => give_back(back, c),
                Ok(Message::Start(_)) => {}
                Ok(m @ Message::Begin { .. }) => next = Some(m),
                Ok(Message::End) | Err(_) => break,
            }
        }
    }
    (file, next)
}

/// The header, then every interval until the variant ends; `next` gets
/// the message that began another variant.
fn write_log(
    out: &mut BufWriter<File>,
    path: &Path,
    messages: &Receiver<Message>,
    back: &Sender<IntervalHists>,
    variant: &str,
    hops: &[String],
    next: &mut Option<Message>,
) -> Result<(), OutputError> {
    let io = |source| OutputError::Io {
        path: path.to_owned(),
        source,
    };
    // StartTime comes before the first interval (the load generator tells
    // it as the load starts); the header waits for it.
    let mut start = None;
    let first = loop {
        match messages.recv() {
            Ok(Message::Start(at)) => start = Some(at),
            Ok(Message::Interval(c)) => break Some(c),
            Ok(m @ Message::Begin { .. }) => {
                *next = Some(m);
                break None;
            }
            Ok(Message::End) | Err(_) => break None,
        }
    };
    let start = start.unwrap_or_else(SystemTime::now);
    let mut serializer = V2DeflateSerializer::new();
    let mut header = IntervalLogWriterBuilder::new();
    header
        .add_comment("[Histogram log format version 1.3]")
        .add_comment(&format!(
            "tailmesh {} variant {variant}: latency per interval of the measured phase, \
             in microseconds (max column in ms); untagged: end to end from the intended \
             send time, ok requests; Tag=hop.<name>: that hop's time, its downstream calls \
             included",
            env!("CARGO_PKG_VERSION")
        ))
        .with_start_time(start)
        .with_base_time(start);
    drop(
        header
            .begin_log_with(&mut *out, &mut serializer)
            .map_err(io)?,
    );
    out.write_all(LEGEND.as_bytes()).map_err(io)?;
    let mut log = IntervalLogWriterBuilder::new()
        .with_max_value_divisor(US_PER_MS)
        .begin_log_with(&mut *out, &mut serializer)
        .map_err(io)?;
    let tags: Vec<String> = hops.iter().map(|h| hop_tag(h)).collect();
    let empty: Histogram<u32> = Histogram::new(3).map_err(|e| io(std::io::Error::other(e)))?;
    let mut current = first;
    loop {
        if let Some(c) = current.take() {
            let written = write_interval(&mut log, &c, &empty, &tags);
            give_back(back, c);
            written.map_err(|source| OutputError::Hlog {
                path: path.to_owned(),
                source,
            })?;
        }
        match messages.recv() {
            Ok(Message::Interval(c)) => current = Some(c),
            Ok(Message::Start(_)) => {}
            Ok(m @ Message::Begin { .. }) => {
                *next = Some(m);
                return Ok(());
            }
            Ok(Message::End) | Err(_) => return Ok(()),
        }
    }
}

type LogError = hdrhistogram::serialization::interval_log::IntervalLogWriterError<
    hdrhistogram::serialization::V2DeflateSerializeError,
>;

/// One interval: the end-to-end histogram untagged, then each hop's.
fn write_interval<W: Write>(
    log: &mut IntervalLogWriter<'_, '_, W, V2DeflateSerializer>,
    c: &ClosedInterval,
    empty: &Histogram<u32>,
    tags: &[String],
) -> Result<(), LogError> {
    let e2e = c.hists.as_ref().map_or(empty, |h| &h.e2e);
    log.write_histogram(e2e, c.start, c.width, None)?;
    for (i, tag) in tags.iter().enumerate() {
        let h = c
            .hists
            .as_ref()
            .and_then(|h| h.hops.get(i))
            .unwrap_or(empty);
        // Hop names are DNS labels: a valid tag, always.
        log.write_histogram(h, c.start, c.width, Tag::new(tag))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use base64::Engine as _;
    use hdrhistogram::serialization::Deserializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};

    use super::*;
    use crate::analysis::latency_intervals::LatencyOverTime;
    use crate::analysis::testing::hop_record;
    use crate::record::{Outcome, RequestRecord};

    /// Three seconds of requests through a and b: `n` a second meant for
    /// the second's start plus `i` ms, taking 1 + (i % 7) ms; the closed
    /// intervals, as the run makes them.
    fn intervals(n: u64) -> Vec<ClosedInterval> {
        let hops = vec!["a".to_owned(), "b".to_owned()];
        let ms = Duration::from_millis;
        let mut over = LatencyOverTime::new(ms(1000), Some(ms(3000)), ms(500), &hops);
        over.export();
        for s in 0..3 {
            for i in 0..n {
                let intended = ms(s * 1000 + i);
                over.record(&RequestRecord {
                    id: s * n + i,
                    intended,
                    start: intended,
                    end: intended + ms(1 + i % 7),
                    outcome: Outcome::Ok,
                    path: vec![
                        hop_record("b", 0, 300, false),
                        hop_record("a", 0, 900, false),
                    ],
                    extra_attempts: 0,
                    attempts: Vec::new(),
                    stream: None,
                });
            }
        }
        over.end(3.0);
        std::iter::from_fn(|| over.pop_closed()).collect()
    }

    /// Writes `closed` as variant "base"'s log into `dir`; its bytes.
    fn write(dir: &Path, closed: Vec<ClosedInterval>, start: SystemTime) -> Vec<u8> {
        let spool = HlogSpool::start(|_, e| panic!("{e}")).expect("the thread");
        let path = dir.join(file_name("base"));
        spool.begin_variant(&path, "base", vec!["a".into(), "b".into()]);
        spool.measuring_from(start);
        for c in closed {
            spool.write(c);
        }
        spool.end_variant();
        let files = spool.finish().expect("written");
        assert_eq!(files.len(), 1);
        assert!(
            !path.exists(),
            "renamed into place with the run's other files only"
        );
        assert_eq!(files[0].path(), path);
        files
            .into_iter()
            .try_for_each(HlogFile::finish)
            .expect("renamed");
        std::fs::read(&path).expect("the log")
    }

    #[test]
    fn an_hlog_round_trips_through_the_crates_reader() {
        let dir = tempfile::tempdir().expect("temp dir");
        let start = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_650_000_123);
        let closed = intervals(200);
        let expected: Vec<(u64, u64, u64)> = closed
            .iter()
            .map(|c| {
                let h = c.hists.as_ref().expect("ok requests in each");
                (h.e2e.len(), h.hops[0].len(), h.e2e.max())
            })
            .collect();
        let bytes = write(dir.path(), closed, start);
        let mut starts = Vec::new();
        let mut seen = Vec::new();
        for entry in IntervalLogIterator::new(&bytes) {
            match entry.expect("an entry") {
                LogEntry::StartTime(t) => starts.push(("start", t)),
                LogEntry::BaseTime(t) => starts.push(("base", t)),
                LogEntry::Interval(h) => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(h.encoded_histogram())
                        .expect("base64");
                    let histogram: Histogram<u64> = Deserializer::new()
                        .deserialize(&mut &raw[..])
                        .expect("a V2 compressed histogram");
                    seen.push((
                        h.tag().map(|t| t.as_str().to_owned()),
                        h.start_timestamp(),
                        h.duration(),
                        histogram.len(),
                        histogram.max(),
                        h.max(),
                    ));
                }
            }
        }
        let t0 = Duration::from_millis(1_764_650_000_123);
        assert_eq!(starts, [("start", t0), ("base", t0)]);
        assert_eq!(seen.len(), 9, "three intervals of three histograms");
        for (i, (e2e, hop_a, max)) in expected.iter().enumerate() {
            let at = Duration::from_secs(i as u64);
            let lines = &seen[i * 3..i * 3 + 3];
            let tags: Vec<Option<&str>> = lines.iter().map(|l| l.0.as_deref()).collect();
            assert_eq!(tags, [None, Some("hop.a"), Some("hop.b")]);
            for l in lines {
                assert_eq!((l.1, l.2), (at, Duration::from_secs(1)), "{l:?}");
            }
            assert_eq!(lines[0].3, *e2e);
            assert_eq!(lines[1].3, *hop_a);
            assert_eq!(lines[0].4, *max);
            // The max column in ms, to the writer's 3 decimals.
            assert!((lines[0].5 - *max as f64 / 1e3).abs() < 1e-3, "{lines:?}");
            assert_eq!(lines[1].4, 900);
        }
        assert_eq!(
            seen.iter()
                .filter(|l| l.0.is_none())
                .map(|l| l.3)
                .sum::<u64>(),
            600
        );
    }

    #[test]
    fn the_header_has_the_java_version_line_and_legend() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bytes = write(dir.path(), intervals(5), SystemTime::UNIX_EPOCH);
        let text = String::from_utf8(bytes).expect("text");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "#[Histogram log format version 1.3]");
        assert!(lines[1].starts_with("#tailmesh "), "{text}");
        assert_eq!(lines[2], "#[StartTime: 0.000 (seconds since epoch)]");
        assert_eq!(lines[3], "#[BaseTime: 0.000 (seconds since epoch)]");
        assert_eq!(lines[4], LEGEND.trim_end());
        assert_eq!(lines[5], "#[MaxValueDivisor: 1000.000]");
        assert!(lines[6].starts_with("0.000,1.000,"), "{text}");
        assert!(lines[7].starts_with("Tag=hop.a,0.000,1.000,"), "{text}");
        assert_eq!(lines.len(), 6 + 9, "{text}");
    }

    #[test]
    fn a_log_that_cannot_be_written_is_told_and_left_absent() {
        let dir = tempfile::tempdir().expect("temp dir");
        let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = std::sync::Arc::clone(&told);
        let spool = HlogSpool::start(move |variants, e| {
            record
                .lock()
                .expect("not poisoned")
                .push((variants, e.to_string()))
        })
        .expect("the thread");
        // A folder that does not exist: the file cannot be made.
        let path = dir.path().join("gone").join(file_name("base"));
        spool.begin_variant(&path, "base", vec!["a".into(), "b".into()]);
        let closed = intervals(5);
        let handed = closed.iter().filter(|c| c.hists.is_some()).count();
        for c in closed {
            spool.write(c);
        }
        spool.end_variant();
        // Every histogram comes back all the same.
        let mut back = 0;
        while back < handed {
            match spool.returned.recv_timeout(Duration::from_secs(60)) {
                Ok(_) => back += 1,
                Err(e) => panic!("{back} of {handed} histograms came back: {e}"),
            }
        }
        let files = spool.finish().expect("the thread ended");
        let told = told.lock().expect("not poisoned").clone();
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].0, 1);
        assert!(told[0].1.contains("base.hlog"), "{told:?}");
        let e = files
            .into_iter()
            .map(HlogFile::finish)
            .next()
            .expect("one log")
            .expect_err("lost");
        assert!(e.to_string().contains("base.hlog"), "{e}");
        assert!(!path.exists());
        assert_eq!(handed, 3);
    }
}

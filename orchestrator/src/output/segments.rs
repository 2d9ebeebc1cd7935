//! `<variant>.segments.json`: a variant's measured segments (lateness,
//! then per hop reach, queue, own and rest), each an HdrHistogram of µs
//! (V2 with deflate, base64), what `tailmesh predict --from` composes a
//! what-if from.

use std::io::Cursor;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2DeflateSerializer};
use serde::{Deserialize, Serialize};

use super::OutputError;
use crate::analysis::{HOP_SEGMENTS, MeasuredSegments};

/// The file of variant `variant`.
pub fn file_name(variant: &str) -> String {
    format!("{variant}.segments.json")
}

#[derive(Serialize, Deserialize)]
struct File {
    variant: String,
    /// How each histogram is written.
    encoding: String,
    lateness: String,
    hops: Vec<HopFile>,
}

#[derive(Serialize, Deserialize)]
struct HopFile {
    hop: String,
    reach: String,
    queue: String,
    own: String,
    rest: String,
}

const ENCODING: &str = "HdrHistogram V2 deflate, base64; values in microseconds";

fn encode(h: &Histogram<u64>) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
    Ok(STANDARD.encode(bytes))
}

/// Writes variant `variant`'s measured segments to `path`.
pub fn write_segments(
    path: &Path,
    variant: &str,
    segments: &MeasuredSegments,
) -> Result<(), OutputError> {
    super::write_atomically(path, |w| {
        let mut hops = Vec::with_capacity(segments.hops.len());
        for (hop, [reach, queue, own, rest]) in &segments.hops {
            hops.push(HopFile {
                hop: hop.clone(),
                reach: encode(reach)?,
                queue: encode(queue)?,
                own: encode(own)?,
                rest: encode(rest)?,
            });
        }
        let file = File {
            variant: variant.to_owned(),
            encoding: ENCODING.to_owned(),
            lateness: encode(&segments.lateness)?,
            hops,
        };
        serde_json::to_writer(w, &file).map_err(std::io::Error::other)
    })
}

/// Why a segments file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SegmentsError {
    #[error("read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a segments file: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: segment {segment}: {why}")]
    Histogram {
        path: String,
        segment: String,
        why: String,
    },
}

/// Reads a segments file: its variant's name and segments.
pub fn read_segments(path: &Path) -> Result<(String, MeasuredSegments), SegmentsError> {
    let shown = path.display().to_string();
    let text = std::fs::read(path).map_err(|source| SegmentsError::Read {
        path: shown.clone(),
        source,
    })?;
    let file: File = serde_json::from_slice(&text).map_err(|source| SegmentsError::Json {
        path: shown.clone(),
        source,
    })?;
    let decode = |segment: &str, text: &str| -> Result<Histogram<u64>, SegmentsError> {
        let fail = |why: String| SegmentsError::Histogram {
            path: shown.clone(),
            segment: segment.to_owned(),
            why,
        };
        let bytes = STANDARD
            .decode(text)
            .map_err(|e| fail(format!("not base64: {e}")))?;
        Deserializer::new()
            .deserialize(&mut Cursor::new(bytes))
            .map_err(|e| fail(format!("not an HdrHistogram: {e:?}")))
    };
    let lateness = decode("lateness", &file.lateness)?;
    let mut hops = Vec::with_capacity(file.hops.len());
    for h in &file.hops {
        let texts = [&h.reach, &h.queue, &h.own, &h.rest];
        let mut parts = Vec::with_capacity(4);
        for (name, text) in HOP_SEGMENTS.iter().zip(texts) {
            parts.push(decode(&format!("{name}:{}", h.hop), text)?);
        }
        let parts: [Histogram<u64>; 4] =
            parts.try_into().map_err(|_| SegmentsError::Histogram {
                path: shown.clone(),
                segment: h.hop.clone(),
                why: "not four segments".to_owned(),
            })?;
        hops.push((h.hop.clone(), parts));
    }
    Ok((file.variant, MeasuredSegments { lateness, hops }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_read_back_as_written() {
        let h = |values: &[u64]| {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            for v in values {
                h.record(*v).expect("in range");
            }
            h
        };
        let segments = MeasuredSegments {
            lateness: h(&[1, 2, 3]),
            hops: vec![(
                "b".to_owned(),
                [h(&[100]), h(&[0, 5]), h(&[2000, 2100, 9000]), h(&[7])],
            )],
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(file_name("base"));
        write_segments(&path, "base", &segments).expect("written");
        let (variant, back) = read_segments(&path).expect("read");
        assert_eq!(variant, "base");
        assert_eq!(back, segments);
        std::fs::write(&path, "{\"variant\": 3}").expect("overwrite");
        let err = read_segments(&path).expect_err("not a segments file");
        assert!(err.to_string().contains("not a segments file"), "{err}");
    }
}

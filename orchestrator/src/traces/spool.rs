//! The spool: every span batch the run receives, appended to a file in the
//! run folder as it arrives, so spans leave memory at once. One file per
//! variant, read back in one streaming pass after the variant (see
//! `sift`) and removed then.
//!
//! A frame is the export request's protobuf bytes behind a header: its
//! length (u32, little-endian) and when it arrived (u64 ns since the
//! collector started, little-endian). Uncompressed: OTLP protobuf of these
//! spans compresses about 3:1, but the spool lives for one variant and a
//! compressor would cost the receiver CPU the load generator shares.

use std::{
    fs::File,
    io::{BufReader, BufWriter, Read, Write},
    path::{Path, PathBuf},
};

use bytes::Bytes;

/// Bytes of a frame's header.
const HEADER: usize = 12;

/// Why the spool could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("span spool {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A frame longer than any export request taken.
    #[error("span spool {}: frame of {len} bytes at byte {at}", path.display())]
    Frame { path: PathBuf, len: usize, at: u64 },
}

/// The file being appended to.
pub(super) struct SpoolWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl SpoolWriter {
    /// A new, empty spool at `path`.
    pub(super) fn create(path: &Path) -> Result<Self, SpoolError> {
        let file = File::create(path).map_err(|source| SpoolError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(SpoolWriter {
            path: path.to_owned(),
            out: BufWriter::with_capacity(256 * 1024, file),
        })
    }

    /// Appends one export request that arrived `arrived_ns` after the start.
    pub(super) fn append(&mut self, arrived_ns: u64, body: &[u8]) -> Result<(), SpoolError> {
        let len = u32::try_from(body.len()).map_err(|_| SpoolError::Frame {
            path: self.path.clone(),
            len: body.len(),
            at: 0,
        })?;
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&len.to_le_bytes());
        header[4..].copy_from_slice(&arrived_ns.to_le_bytes());
        self.out
            .write_all(&header)
            .and_then(|()| self.out.write_all(body))
            .map_err(|source| SpoolError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Flushes and closes the file; returns its path and whether the
    /// flush went through.
    pub(super) fn finish(mut self) -> (PathBuf, Result<(), SpoolError>) {
        let flushed = self.out.flush().map_err(|source| SpoolError::Io {
            path: self.path.clone(),
            source,
        });
        (self.path, flushed)
    }

    /// Closes the file after an error without writing what is buffered
    /// (which may continue a frame cut short); returns its path.
    pub(super) fn abandon(self) -> PathBuf {
        let (_file, _unwritten) = self.out.into_parts();
        self.path
    }
}

/// One frame read back.
#[derive(Debug)]
pub struct Frame {
    /// When it arrived, ns since the collector started.
    pub arrived_ns: u64,
    /// The export request's bytes.
    pub body: Bytes,
}

/// Reads a spool's frames in the order they arrived.
pub struct SpoolReader {
    path: PathBuf,
    input: BufReader<File>,
    at: u64,
}

impl SpoolReader {
    /// Opens the spool at `path`.
    pub fn open(path: &Path) -> Result<Self, SpoolError> {
        let file = File::open(path).map_err(|source| SpoolError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(SpoolReader {
            path: path.to_owned(),
            input: BufReader::with_capacity(256 * 1024, file),
            at: 0,
        })
    }

    /// The next frame, `None` at the end. A frame cut short (the disk
    /// filled while it was written) ends the spool.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SpoolError> {
        let io = |source| SpoolError::Io {
            path: self.path.clone(),
            source,
        };
        let mut header = [0u8; HEADER];
        match self.input.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(io(e)),
        }
        let mut len = [0u8; 4];
        len.copy_from_slice(&header[..4]);
        let len = u32::from_le_bytes(len) as usize;
        let mut arrived = [0u8; 8];
        arrived.copy_from_slice(&header[4..]);
        if len > super::raw::MAX_REQUEST {
            return Err(SpoolError::Frame {
                path: self.path.clone(),
                len,
                at: self.at,
            });
        }
        let mut body = vec![0u8; len];
        match self.input.read_exact(&mut body) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(io(e)),
        }
        self.at += (HEADER + len) as u64;
        Ok(Some(Frame {
            arrived_ns: u64::from_le_bytes(arrived),
            body: body.into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_back_in_order_and_a_cut_frame_ends_the_spool() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.spool");
        let mut w = SpoolWriter::create(&path).expect("create");
        w.append(5, b"first").expect("append");
        w.append(9, b"").expect("append");
        w.append(12, b"third one").expect("append");
        w.finish().1.expect("finish");
        let mut r = SpoolReader::open(&path).expect("open");
        let mut got = Vec::new();
        while let Some(f) = r.next_frame().expect("read") {
            got.push((f.arrived_ns, f.body.to_vec()));
        }
        assert_eq!(
            got,
            [
                (5, b"first".to_vec()),
                (9, Vec::new()),
                (12, b"third one".to_vec())
            ]
        );
        // Cut the last frame short: the two whole ones remain.
        let len = std::fs::metadata(&path).expect("meta").len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.set_len(len - 3).expect("truncate");
        let mut r = SpoolReader::open(&path).expect("open");
        let mut n = 0;
        while r.next_frame().expect("read").is_some() {
            n += 1;
        }
        assert_eq!(n, 2);
    }
}

//! Why a file could not be read: always the file, and the line or the span.

/// A file that cannot be imported. Messages name the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// Not JSON, or JSON of another shape than the format's.
    #[error("{file}: line {line}, column {column}: {message}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// A record whose field cannot be read.
    #[error("{file}: {place}: {message}")]
    Field {
        file: String,
        /// `line 12` or `span 3f2a...`.
        place: String,
        message: String,
    },
    /// A CSV without a column the format needs.
    #[error("{file}: line 1: no column {column:?} (the header has: {header})")]
    MissingColumn {
        file: String,
        column: &'static str,
        header: String,
    },
}

impl ImportError {
    pub(crate) fn json(file: &str, line_offset: usize, e: &serde_json::Error) -> Self {
        ImportError::Json {
            file: file.to_string(),
            line: e.line() + line_offset,
            column: e.column(),
            // serde_json appends " at line L column C": said once, above.
            message: e
                .to_string()
                .split(" at line ")
                .next()
                .unwrap_or_default()
                .to_string(),
        }
    }

    pub(crate) fn io(file: &str, source: std::io::Error) -> Self {
        ImportError::Io {
            file: file.to_string(),
            source,
        }
    }

    pub(crate) fn field(file: &str, place: impl Into<String>, message: impl Into<String>) -> Self {
        ImportError::Field {
            file: file.to_string(),
            place: place.into(),
            message: message.into(),
        }
    }
}

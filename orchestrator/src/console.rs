//! What tailmesh prints for people: lines on standard output and standard
//! error that never bring the process down. `println!` panics when its
//! stream is gone (`tailmesh run | head`), which would turn a bad scenario's
//! exit status 2 into a panic's 101 and stop a run before its results are
//! written; here a closed stream only loses the text.

use std::{
    fmt,
    io::{self, Write},
};

/// Writes one line to standard output; a write error is ignored.
pub fn out(line: fmt::Arguments<'_>) {
    let mut stdout = io::stdout().lock();
    let _ = stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
}

/// Writes `text` to standard output as it is; a write error is ignored.
pub fn out_text(text: &str) {
    let mut stdout = io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// Writes one line to standard error; a write error is ignored.
pub fn err(line: fmt::Arguments<'_>) {
    let mut stderr = io::stderr().lock();
    let _ = stderr
        .write_fmt(line)
        .and_then(|()| stderr.write_all(b"\n"));
}

/// `println!` that survives a closed standard output.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => { $crate::console::out(format_args!($($arg)*)) };
}

/// `eprintln!` that survives a closed standard error.
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => { $crate::console::err(format_args!($($arg)*)) };
}

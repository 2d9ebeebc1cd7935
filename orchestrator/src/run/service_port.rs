//! A port for a service the run starts ([`service_port`]). The service
//! binds it itself, after the run has let go of it, so the run cannot hold
//! it in between; what it can do is take it where nothing else takes
//! ports unasked. A port from `bind(0)` is an ephemeral one, the range the
//! kernel also takes every outgoing connection's source port from, so any
//! connection of the run's own processes could take it before the service
//! binds it. This one is outside that range, checked free by binding it,
//! and the candidates go round the range from a random start, so runs
//! started together try different ports first.

use std::{
    net::{Ipv4Addr, TcpListener},
    ops::RangeInclusive,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

/// Linux's default ephemeral range, when the kernel's cannot be read.
const DEFAULT_EPHEMERAL: RangeInclusive<u16> = 32768..=60999;

/// The lowest port handed out: below it, the registered ports that a
/// machine's own services tend to listen on.
const LOWEST: u16 = 10000;

/// The fewest ports a range outside the ephemeral one must have to be
/// used; with less (a machine whose ephemeral range is nearly everything),
/// the kernel's `bind(0)` is used as before.
const FEWEST: u32 = 1000;

/// How many candidates are tried before giving up.
const ATTEMPTS: u32 = 100;

/// A free port of 127.0.0.1 outside the kernel's ephemeral range (see the
/// module's documentation).
pub(crate) fn service_port() -> std::io::Result<u16> {
    let Some(range) = candidates(&ephemeral_range()) else {
        return bound_port(0);
    };
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new(rand::random()));
    let (start, size) = (u32::from(*range.start()), span(&range));
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let port = start + next.fetch_add(1, Ordering::Relaxed) % size;
        // Within the range, so within u16.
        match bound_port(port as u16) {
            Ok(port) => return Ok(port),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port tried")))
}

/// Binds `port` of 127.0.0.1 and lets it go: the port bound.
fn bound_port(port: u16) -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, port))?
        .local_addr()?
        .port())
}

/// The kernel's ephemeral range (`ip_local_port_range`), or Linux's
/// default.
fn ephemeral_range() -> RangeInclusive<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| parse_range(&text))
        .unwrap_or(DEFAULT_EPHEMERAL)
}

/// `"32768\t60999\n"` as a range.
fn parse_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut words = text.split_whitespace().map(str::parse::<u16>);
    let (low, high) = (words.next()?.ok()?, words.next()?.ok()?);
    (low <= high).then_some(low..=high)
}

/// The larger of the ranges below and above `ephemeral` (from [`LOWEST`]
/// up), when it has at least [`FEWEST`] ports.
fn candidates(ephemeral: &RangeInclusive<u16>) -> Option<RangeInclusive<u16>> {
    let below = (*ephemeral.start() > LOWEST).then(|| LOWEST..=ephemeral.start() - 1);
    let above =
        (*ephemeral.end() < u16::MAX).then(|| (*ephemeral.end()).max(LOWEST - 1) + 1..=u16::MAX);
    [below, above]
        .into_iter()
        .flatten()
        .filter(|r| span(r) >= FEWEST)
        .max_by_key(span)
}

fn span(range: &RangeInclusive<u16>) -> u32 {
    u32::from(*range.end()) + 1 - u32::from(*range.start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_outside_the_ephemeral_range() {
        assert_eq!(parse_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_range("9 x"), None);
        assert_eq!(parse_range("10 9"), None);
        // Linux's default: below it, from 10000.
        assert_eq!(candidates(&(32768..=60999)), Some(10000..=32767));
        // The larger side wins; a side too small is not used.
        assert_eq!(candidates(&(10500..=20000)), Some(20001..=65535));
        assert_eq!(candidates(&(1024..=65000)), None);
        assert_eq!(candidates(&(1024..=65535)), None);
        let ephemeral = ephemeral_range();
        let (a, b) = (service_port(), service_port());
        let (a, b) = (a.expect("a port"), b.expect("another"));
        assert_ne!(a, b, "taken in turn");
        for port in [a, b] {
            assert!(!ephemeral.contains(&port), "{port} in {ephemeral:?}");
            assert!(bound_port(port).is_ok(), "{port} is free");
        }
    }
}

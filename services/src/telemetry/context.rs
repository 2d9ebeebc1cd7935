//! The trace context a request carries: a `Copy` value (trace id, span id,
//! sampled), made current while a future is polled ([`scope`]), and
//! written to and read from W3C `traceparent` values by hand: formatted
//! into a stack buffer and parsed in place, without allocating.
//! `tracestate` is neither read nor written: tailmesh's spans carry no
//! vendor state.

use std::{cell::Cell, future::Future, pin::pin, task::Poll};

use super::fields::SpanFields;

/// One span's identity as its children and callees see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: u128,
    pub span_id: u64,
    /// Whether the trace is recorded (W3C flag 01).
    pub sampled: bool,
    /// Whether this context came from another process (a `traceparent`);
    /// OTLP spans say whether their parent was remote.
    pub remote: bool,
}

/// The header (metadata key) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// The length of a version-00 `traceparent` value.
pub const LEN: usize = 55;

impl SpanContext {
    /// The `traceparent` value of this context as ASCII bytes: version 00,
    /// lower-case hex ids, the sampled flag.
    pub fn traceparent_bytes(&self) -> [u8; LEN] {
        let mut out = [0u8; LEN];
        out[..3].copy_from_slice(b"00-");
        hex(&mut out[3..35], self.trace_id);
        out[35] = b'-';
        hex(&mut out[36..52], u128::from(self.span_id));
        out[52..].copy_from_slice(if self.sampled { b"-01" } else { b"-00" });
        out
    }

    /// [`SpanContext::traceparent_bytes`] as a string.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(LEN);
        self.write_traceparent(&mut out);
        out
    }

    /// Replaces `out`'s text by this context's `traceparent` (reusing its
    /// memory when it has room).
    pub fn write_traceparent(&self, out: &mut String) {
        out.clear();
        // Every byte of the value is ASCII.
        out.extend(self.traceparent_bytes().iter().map(|&b| char::from(b)));
    }

    /// Parses a `traceparent` value as the W3C format defines it: a
    /// two-digit version other than `ff` (version 00 has exactly four
    /// fields; later versions may append fields after a `-`), a 32-digit
    /// trace id and a 16-digit span id, neither all zeros, and two flag
    /// digits, all lower-case hex. `None` when it is not one.
    pub fn parse(value: &str) -> Option<SpanContext> {
        Self::parse_bytes(value.as_bytes())
    }

    /// [`SpanContext::parse`] of a header value's bytes (surrounding
    /// spaces and tabs are allowed, as in HTTP).
    pub fn parse_bytes(value: &[u8]) -> Option<SpanContext> {
        let b = value.trim_ascii();
        if b.len() < LEN || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = unhex(&b[..2])?;
        if version == 0xff || (version == 0 && b.len() != LEN) || (b.len() > LEN && b[LEN] != b'-')
        {
            return None;
        }
        let trace_id = u128::from(unhex(&b[3..19])?) << 64 | u128::from(unhex(&b[19..35])?);
        let span_id = unhex(&b[36..52])?;
        let flags = unhex(&b[53..55])?;
        (trace_id != 0 && span_id != 0).then_some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
            remote: true,
        })
    }
}

fn hex(out: &mut [u8], mut value: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(value & 0xf) as usize];
        value >>= 4;
    }
}

/// At most 16 digits of lower-case hex only (upper case is invalid in
/// `traceparent`): every digit goes through [`HEX_VALUE`], without a
/// branch per digit, and one check at the end says whether any was not
/// a digit.
fn unhex(digits: &[u8]) -> Option<u64> {
    debug_assert!(digits.len() <= 16);
    let (value, invalid) = digits.iter().fold((0u64, 0u8), |(acc, invalid), &d| {
        let v = HEX_VALUE[usize::from(d)];
        ((acc << 4) | u64::from(v & 0xf), invalid | v)
    });
    (invalid & NOT_HEX == 0).then_some(value)
}

/// Marks a byte that is not a lower-case hex digit in [`HEX_VALUE`].
const NOT_HEX: u8 = 0x80;
/// Each byte's value as a lower-case hex digit, or [`NOT_HEX`].
const HEX_VALUE: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut d = 0;
    while d < 16 {
        table[b"0123456789abcdef"[d] as usize] = d as u8;
        d += 1;
    }
    table
};

thread_local! {
    /// The context of the future being polled on this thread.
    static CURRENT: Cell<Option<SpanContext>> = const { Cell::new(None) };
    /// Fields set on the current span ([`super::set_current`]) during
    /// this poll, collected by the innermost [`scope`] after it.
    static PENDING: Cell<SpanFields> = const { Cell::new(SpanFields::EMPTY) };
    /// Whether anything was set in `PENDING` since it was last emptied:
    /// most polls set nothing, and then a scope moves no fields in or out.
    static SET: Cell<bool> = const { Cell::new(false) };
}

/// The context of the future being polled (set by [`scope`]), if any.
pub fn current() -> Option<SpanContext> {
    CURRENT.with(Cell::get)
}

/// Sets fields on the current scope's span (dropped when the scope has
/// no span of its own).
pub(super) fn set_pending(set: impl FnOnce(&mut SpanFields)) {
    PENDING.with(|p| {
        let mut fields = p.take();
        set(&mut fields);
        p.set(fields);
    });
    SET.set(true);
}

/// Takes what was set in `PENDING`, if anything was, leaving it empty.
fn take_pending() -> Option<SpanFields> {
    SET.replace(false).then(|| PENDING.with(Cell::take))
}

/// Restores the outer scope's context and pending fields when left, also
/// when the inner poll panics.
struct Enter {
    outer: Option<SpanContext>,
    /// What the outer scope's span had set (`None`: nothing).
    outer_pending: Option<SpanFields>,
    left: bool,
}

impl Enter {
    fn new(cx: Option<SpanContext>) -> Self {
        Enter {
            outer: CURRENT.with(|c| c.replace(cx)),
            outer_pending: take_pending(),
            left: false,
        }
    }

    /// Leaves the scope, returning what was set on its span, if anything.
    fn leave(&mut self) -> Option<SpanFields> {
        self.left = true;
        CURRENT.with(|c| c.set(self.outer));
        let set = take_pending();
        if let Some(outer) = self.outer_pending.take() {
            PENDING.with(|p| p.set(outer));
            SET.set(true);
        }
        set
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        if !self.left {
            self.leave();
        }
    }
}

/// Runs `fut` with `cx` current on every poll (what clients inject);
/// fields set on the current span meanwhile go to `sink`, or nowhere.
pub async fn scope<F: Future>(
    cx: Option<SpanContext>,
    mut sink: Option<&mut SpanFields>,
    fut: F,
) -> F::Output {
    let mut fut = pin!(fut);
    std::future::poll_fn(move |task| {
        let mut enter = Enter::new(cx);
        let poll: Poll<F::Output> = fut.as_mut().poll(task);
        if let (Some(set), Some(sink)) = (enter.leave(), sink.as_deref_mut()) {
            sink.merge(set);
        }
        poll
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(trace_id: u128, span_id: u64, sampled: bool) -> SpanContext {
        SpanContext {
            trace_id,
            span_id,
            sampled,
            remote: true,
        }
    }

    #[test]
    fn traceparent_round_trips_and_is_w3c() {
        let c = cx(0xabc, 0x12, true);
        let value = c.traceparent();
        assert_eq!(
            value,
            "00-00000000000000000000000000000abc-0000000000000012-01"
        );
        assert_eq!(SpanContext::parse(&value), Some(c));
        let full = cx(u128::MAX - 1, u64::MAX, false);
        assert_eq!(SpanContext::parse(&full.traceparent()), Some(full));
        assert!(full.traceparent().ends_with("-00"));
    }

    #[test]
    fn traceparent_bytes_string_and_rewrite_agree() {
        let c = cx(
            0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c,
            0xb7ad_6b71_6920_3331,
            true,
        );
        let bytes = c.traceparent_bytes();
        assert_eq!(
            &bytes[..],
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(c.traceparent().as_bytes(), &bytes[..]);
        let mut reused = cx(1, 2, false).traceparent();
        c.write_traceparent(&mut reused);
        assert_eq!(reused.as_bytes(), &bytes[..]);
        assert_eq!(SpanContext::parse_bytes(&bytes), Some(c));
        // Surrounding blanks are allowed, as in HTTP header values.
        let mut padded = b" \t".to_vec();
        padded.extend_from_slice(&bytes);
        padded.push(b' ');
        assert_eq!(SpanContext::parse_bytes(&padded), Some(c));
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        let ok = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(SpanContext::parse(ok).is_some());
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033g1-01",
            "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(SpanContext::parse(bad), None, "{bad:?}");
        }
        // A later version may append fields; unknown flags are ignored.
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03-xyz";
        let parsed = SpanContext::parse(later).expect("later version");
        assert!(parsed.sampled);
        assert_eq!(parsed.span_id, 0xb7ad_6b71_6920_3331);
    }

    #[tokio::test]
    async fn scope_makes_its_context_current_and_collects_fields() {
        assert_eq!(current(), None);
        let outer = cx(1, 2, true);
        let inner = cx(1, 3, true);
        let mut outer_set = SpanFields::default();
        let mut inner_set = SpanFields::default();
        scope(Some(outer), Some(&mut outer_set), async {
            assert_eq!(current(), Some(outer));
            set_pending(|f| f.slow = Some(true));
            scope(Some(inner), Some(&mut inner_set), async {
                assert_eq!(current(), Some(inner));
                tokio::task::yield_now().await;
                assert_eq!(current(), Some(inner));
                set_pending(|f| f.queue_wait_ns = Some(2));
            })
            .await;
            assert_eq!(current(), Some(outer));
            set_pending(|f| f.slot_wait_ns = Some(3));
        })
        .await;
        assert_eq!(current(), None);
        assert_eq!(
            outer_set,
            SpanFields {
                slow: Some(true),
                slot_wait_ns: Some(3),
                ..SpanFields::default()
            }
        );
        assert_eq!(
            inner_set,
            SpanFields {
                queue_wait_ns: Some(2),
                ..SpanFields::default()
            }
        );
    }
}

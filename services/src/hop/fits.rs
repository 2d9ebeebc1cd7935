//! Does a service's reply fit its method's output message? The answer
//! `prost_reflect::DynamicMessage::decode` would give, found by walking
//! the protobuf wire format against the message's descriptor without
//! building the message: no allocation, no copies, a few hundred
//! nanoseconds for a small reply where a decode takes microseconds.
//!
//! The walk follows prost's decoding rule for rule (prost-reflect decodes
//! with prost's primitives): a key is a varint of at most 32 bits whose
//! field number is not 0 and whose wire type is one of the six; a known
//! field's wire type must be its kind's (a repeated scalar may also come
//! packed, length-delimited); a map field's entries are read whatever
//! their wire type says, as prost-reflect does; strings must be UTF-8;
//! fixed-size values and length-delimited ones must fit in what is left of
//! their enclosing message; groups must end with their own number; unknown
//! fields are skipped (groups among them checked); and nesting is bounded
//! as prost bounds it (100 levels). Varint values themselves are never
//! out of range: prost truncates them, as protobuf does.

use prost::{
    bytes::Buf,
    encoding::{WireType, decode_key, decode_varint},
};
use prost_reflect::{ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor};

/// prost's nesting limit (`prost::RECURSION_LIMIT`, which is private).
const RECURSION_LIMIT: u32 = 100;

/// Why bytes are not a message: what prost would have said, near enough.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Misfit(String);

/// Whether `bytes` decode as a `message` (see the module's docs).
pub fn check(message: &MessageDescriptor, bytes: &[u8]) -> Result<(), Misfit> {
    let mut buf = bytes;
    fields(message, &mut buf, RECURSION_LIMIT)
}

/// The fields of `message` until `buf` is empty.
fn fields(message: &MessageDescriptor, buf: &mut &[u8], depth: u32) -> Result<(), Misfit> {
    while buf.has_remaining() {
        let (number, wire) = key(buf)?;
        field(message, number, wire, buf, depth)?;
    }
    Ok(())
}

fn key(buf: &mut &[u8]) -> Result<(u32, WireType), Misfit> {
    decode_key(buf).map_err(|e| Misfit(format!("a field's key: {e}")))
}

fn varint(buf: &mut &[u8], what: &str) -> Result<u64, Misfit> {
    decode_varint(buf).map_err(|e| Misfit(format!("{what}: {e}")))
}

/// What a field is, for a field or an extension alike.
struct Shape {
    kind: Kind,
    list: bool,
    map: bool,
    group: bool,
}

impl From<FieldDescriptor> for Shape {
    fn from(f: FieldDescriptor) -> Self {
        Shape {
            kind: f.kind(),
            list: f.is_list(),
            map: f.is_map(),
            group: f.is_group(),
        }
    }
}

impl From<ExtensionDescriptor> for Shape {
    fn from(f: ExtensionDescriptor) -> Self {
        Shape {
            kind: f.kind(),
            list: f.is_list(),
            map: f.is_map(),
            group: f.is_group(),
        }
    }
}

/// One field of `message`, its key read.
fn field(
    message: &MessageDescriptor,
    number: u32,
    wire: WireType,
    buf: &mut &[u8],
    depth: u32,
) -> Result<(), Misfit> {
    let shape = match message.get_field(number) {
        Some(f) => Shape::from(f),
        None => match message.get_extension(number) {
            Some(e) => Shape::from(e),
            None => return skip(Skipping::Unknown, number, wire, buf, depth),
        },
    };
    let named = |e: Misfit| {
        Misfit(format!(
            "field {number} of {}: {}",
            message.full_name(),
            e.0
        ))
    };
    if shape.map {
        let Kind::Message(entry) = &shape.kind else {
            return Err(named(Misfit("a map whose entry is no message".into())));
        };
        // prost-reflect reads a map entry whatever the wire type says.
        return delimited(buf, |inner| map_entry(entry, inner, depth)).map_err(named);
    }
    let packable = !matches!(shape.kind, Kind::String | Kind::Bytes | Kind::Message(_));
    if shape.list && packable && wire == WireType::LengthDelimited {
        let wire = scalar_wire(&shape.kind);
        return delimited(buf, |inner| {
            while inner.has_remaining() {
                value(&shape.kind, false, number, wire, inner, depth)?;
            }
            Ok(())
        })
        .map_err(named);
    }
    value(&shape.kind, shape.group, number, wire, buf, depth).map_err(named)
}

/// The wire type of a packable kind's values.
fn scalar_wire(kind: &Kind) -> WireType {
    match kind {
        Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => WireType::ThirtyTwoBit,
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => WireType::SixtyFourBit,
        Kind::String | Kind::Bytes | Kind::Message(_) => WireType::LengthDelimited,
        _ => WireType::Varint,
    }
}

fn expect(wanted: WireType, got: WireType) -> Result<(), Misfit> {
    if wanted == got {
        Ok(())
    } else {
        Err(Misfit(format!(
            "invalid wire type: {got:?} (expected {wanted:?})"
        )))
    }
}

/// One value of kind `kind` (a group when `group`), its wire type `wire`.
fn value(
    kind: &Kind,
    group: bool,
    number: u32,
    wire: WireType,
    buf: &mut &[u8],
    depth: u32,
) -> Result<(), Misfit> {
    match kind {
        Kind::Message(inner) if group => {
            expect(WireType::StartGroup, wire)?;
            enter(depth)?;
            group_fields(number, buf, |n, w, buf| field(inner, n, w, buf, depth - 1))
        }
        Kind::Message(inner) => {
            expect(WireType::LengthDelimited, wire)?;
            enter(depth)?;
            delimited(buf, |body| fields(inner, body, depth - 1))
        }
        Kind::String => {
            expect(WireType::LengthDelimited, wire)?;
            delimited(buf, |body| {
                std::str::from_utf8(body).map_err(|_| {
                    Misfit("invalid string value: data is not UTF-8 encoded".into())
                })?;
                body.advance(body.len());
                Ok(())
            })
        }
        Kind::Bytes => {
            expect(WireType::LengthDelimited, wire)?;
            delimited(buf, |body| {
                body.advance(body.len());
                Ok(())
            })
        }
        _ => {
            let wanted = scalar_wire(kind);
            expect(wanted, wire)?;
            match wanted {
                WireType::ThirtyTwoBit => fixed(buf, 4),
                WireType::SixtyFourBit => fixed(buf, 8),
                _ => varint(buf, "a varint").map(drop),
            }
        }
    }
}

/// One map entry's fields: the key (1) and value (2) as their kinds say,
/// anything else skipped as prost's `skip_field` does.
fn map_entry(entry: &MessageDescriptor, buf: &mut &[u8], depth: u32) -> Result<(), Misfit> {
    while buf.has_remaining() {
        let (number, wire) = key(buf)?;
        match entry.get_field(number).filter(|_| number <= 2) {
            Some(f) => value(&f.kind(), f.is_group(), number, wire, buf, depth)?,
            None => skip(Skipping::Field, number, wire, buf, depth)?,
        }
    }
    Ok(())
}

/// Which of the two skipping rules a field is passed over by.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Skipping {
    /// prost's `skip_field` (a map entry's other fields): every field
    /// needs depth left, and a stray end of group is unexpected.
    Field,
    /// An unknown field, as prost-reflect keeps it
    /// (`UnknownField::decode_value`): only a group needs depth left, and
    /// an end of group is the wrong wire type.
    Unknown,
}

/// Passes over one field whose key is read, checking what `rule` checks.
fn skip(
    rule: Skipping,
    number: u32,
    wire: WireType,
    buf: &mut &[u8],
    depth: u32,
) -> Result<(), Misfit> {
    if rule == Skipping::Field || wire == WireType::StartGroup {
        enter(depth)?;
    }
    match wire {
        WireType::Varint => varint(buf, "a varint").map(drop),
        WireType::ThirtyTwoBit => fixed(buf, 4),
        WireType::SixtyFourBit => fixed(buf, 8),
        WireType::LengthDelimited => delimited(buf, |body| {
            body.advance(body.len());
            Ok(())
        }),
        WireType::StartGroup => {
            group_fields(number, buf, |n, w, buf| skip(rule, n, w, buf, depth - 1))
        }
        WireType::EndGroup => Err(Misfit(match rule {
            Skipping::Field => "unexpected end group tag".into(),
            Skipping::Unknown => "invalid wire type: EndGroup (expected StartGroup)".into(),
        })),
    }
}

/// A group's fields, its start read, each passed to `each` until the end
/// of group numbered `number`.
fn group_fields(
    number: u32,
    buf: &mut &[u8],
    mut each: impl FnMut(u32, WireType, &mut &[u8]) -> Result<(), Misfit>,
) -> Result<(), Misfit> {
    loop {
        let (n, w) = key(buf)?;
        if w == WireType::EndGroup {
            return if n == number {
                Ok(())
            } else {
                Err(Misfit("unexpected end group tag".into()))
            };
        }
        each(n, w, buf)?;
    }
}

/// prost's recursion check: a nested message or group needs depth left.
fn enter(depth: u32) -> Result<(), Misfit> {
    if depth == 0 {
        Err(Misfit("recursion limit reached".into()))
    } else {
        Ok(())
    }
}

fn fixed(buf: &mut &[u8], len: usize) -> Result<(), Misfit> {
    if buf.remaining() < len {
        return Err(Misfit("buffer underflow".into()));
    }
    buf.advance(len);
    Ok(())
}

/// A length-delimited body, read by `read`, which must take all of it:
/// the length is a varint and the body must fit in `buf`. A body that
/// reads past its own end is refused, as prost refuses it (its
/// "delimited length exceeded").
fn delimited(
    buf: &mut &[u8],
    read: impl FnOnce(&mut &[u8]) -> Result<(), Misfit>,
) -> Result<(), Misfit> {
    let len = varint(buf, "a length")?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= buf.remaining())
        .ok_or_else(|| Misfit("buffer underflow".into()))?;
    let (mut body, rest) = buf.split_at(len);
    read(&mut body)?;
    if body.has_remaining() {
        return Err(Misfit("delimited length exceeded".into()));
    }
    *buf = rest;
    Ok(())
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost_reflect::{DescriptorPool, DynamicMessage};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// Every kind of field the walk tells apart: scalars of each wire
    /// type, strings, packed and unpacked lists, nested messages, maps, a
    /// group, an enum and extensions.
    const SCHEMA: &str = r#"
        syntax = "proto2";
        package t;
        enum Color { RED = 0; GREEN = 1; }
        message Inner {
          optional int32 a = 1;
          optional string s = 2;
          repeated Inner kids = 3;
        }
        message Out {
          optional string name = 1;
          optional bytes data = 2;
          optional int64 big = 3;
          optional fixed32 f32 = 4;
          optional double d = 5;
          repeated int32 nums = 6;
          repeated sfixed64 fx = 7 [packed = true];
          optional Inner inner = 8;
          map<string, Inner> by_name = 9;
          map<int32, string> labels = 10;
          optional group G = 11 { optional uint32 x = 12; optional string y = 13; }
          repeated Color colors = 14;
          optional bool flag = 15;
          optional float f = 16;
          extensions 100 to 200;
        }
        extend Out {
          optional string note = 100;
          optional Inner more = 101;
        }
    "#;

    struct Source;

    impl protox::file::FileResolver for Source {
        fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
            if name == "t.proto" {
                protox::file::File::from_source(name, SCHEMA)
            } else {
                Err(protox::Error::file_not_found(name))
            }
        }
    }

    fn pool() -> DescriptorPool {
        let mut compiler = protox::Compiler::with_file_resolver(Source);
        compiler
            .open_file("t.proto")
            .unwrap_or_else(|e| panic!("the test schema compiles: {e}"));
        compiler.descriptor_pool()
    }

    fn message(pool: &DescriptorPool, name: &str) -> MessageDescriptor {
        pool.get_message_by_name(name)
            .unwrap_or_else(|| panic!("{name} in the test schema"))
    }

    /// Some valid encodings of `t.Out`: every field set, a deep nesting,
    /// an extension, unknown fields of every wire type.
    fn valid(out: &MessageDescriptor) -> Vec<Vec<u8>> {
        let json = r#"{
            "name": "caf\u00e9", "data": "AAEC", "big": "-5", "f32": 7, "d": 1.5,
            "nums": [1, -2, 300], "fx": ["-1", "2"],
            "inner": {"a": 1, "s": "x", "kids": [{"a": 2, "kids": [{"s": "deep"}]}]},
            "byName": {"k": {"a": 3}, "": {}}, "labels": {"-1": "minus", "7": "seven"},
            "g": {"x": 9, "y": "why"}, "colors": ["GREEN", "RED"], "flag": true,
            "f": 0.25
        }"#;
        let full = crate::protojson::parse_message(out, json)
            .unwrap_or_else(|e| panic!("the test JSON fits: {e}"))
            .encode_to_vec();
        let mut with_extras = full.clone();
        // Extension 100 (a string) and 101 (an Inner), then unknown fields
        // 300 of each wire type, an unknown group holding one of each.
        with_extras.extend_from_slice(&[0xa2, 0x06, 2, b'h', b'i']);
        with_extras.extend_from_slice(&[0xaa, 0x06, 2, 0x08, 0x05]);
        with_extras.extend_from_slice(&[0xe0, 0x12, 0x96, 0x01]);
        with_extras.extend_from_slice(&[0xe1, 0x12, 1, 2, 3, 4, 5, 6, 7, 8]);
        with_extras.extend_from_slice(&[0xe2, 0x12, 3, 0xff, 0xfe, 0xfd]);
        with_extras.extend_from_slice(&[0xe5, 0x12, 1, 2, 3, 4]);
        with_extras.extend_from_slice(&[0xe3, 0x12, 0x08, 0x01, 0x12, 0x00, 0xe4, 0x12]);
        // Packed `nums` (declared unpacked) and unpacked `fx` (declared
        // packed): both are read either way.
        with_extras.extend_from_slice(&[0x32, 3, 1, 2, 3]);
        with_extras.extend_from_slice(&[0x39, 1, 0, 0, 0, 0, 0, 0, 0]);
        vec![Vec::new(), full, with_extras]
    }

    fn agree(desc: &MessageDescriptor, bytes: &[u8]) -> bool {
        let walked = check(desc, bytes);
        let decoded = DynamicMessage::decode(desc.clone(), bytes);
        assert_eq!(
            walked.is_ok(),
            decoded.is_ok(),
            "{bytes:02x?}: the walk says {walked:?}, the decode {:?}",
            decoded.err()
        );
        walked.is_ok()
    }

    #[test]
    fn valid_messages_fit() {
        let pool = pool();
        let out = message(&pool, "t.Out");
        for bytes in valid(&out) {
            assert_eq!(check(&out, &bytes), Ok(()), "{bytes:02x?}");
            assert!(agree(&out, &bytes));
        }
    }

    #[test]
    fn misfits_are_refused_as_a_decode_refuses_them() {
        let pool = pool();
        let out = message(&pool, "t.Out");
        let misfits: [&[u8]; 15] = [
            &[0x08],                   // a varint field with no value
            &[0x0a, 5, b'a'],          // a string longer than what is left
            &[0x0a, 1, 0xff],          // a string that is not UTF-8
            &[0x08, 0x01],             // `name` (a string) as a varint
            &[0x25, 1, 2],             // `f32` with 2 of its 4 bytes
            &[0x00, 0x01],             // field number 0
            &[0x0f],                   // wire type 7
            &[0x5b, 0x60, 1, 0x64],    // group 11 ended as 12
            &[0x5b, 0x60, 1],          // group 11 never ended
            &[0x5c],                   // an end-group at the top
            &[0x42, 1, 0x08],          // `inner` whose varint runs out
            &[0x42, 2, 0x08],          // `inner` longer than what is left
            &[0x42, 1, 0x12, 1, b'x'], // `inner` whose string overruns it
            &[0x3a, 3, 1, 2, 3],       // packed `fx` not a multiple of 8
            &[0x4a, 3, 0x0a, 1, 0xc3], // a map key that is not UTF-8
        ];
        for bytes in misfits {
            assert!(check(&out, bytes).is_err(), "{bytes:02x?}");
            assert!(!agree(&out, bytes));
        }
        // A 10-byte varint whose last byte overflows 64 bits.
        let mut long = vec![0x18];
        long.extend_from_slice(&[0xff; 9]);
        long.push(0x02);
        assert!(!agree(&out, &long));
    }

    #[test]
    fn nesting_is_bounded_as_a_decode_bounds_it() {
        let pool = pool();
        let inner = message(&pool, "t.Inner");
        // `kids` nested `depth` deep.
        let nested = |depth: usize| {
            let mut bytes = Vec::new();
            for _ in 0..depth {
                let mut outer = vec![0x1a];
                prost::encoding::encode_varint(bytes.len() as u64, &mut outer);
                outer.extend_from_slice(&bytes);
                bytes = outer;
            }
            bytes
        };
        let fits: Vec<bool> = [99, 100, 101, 150]
            .iter()
            .map(|&d| agree(&inner, &nested(d)))
            .collect();
        assert_eq!(fits, [true, true, false, false]);
        // Unknown groups nest too.
        let groups = |depth: usize| {
            let mut bytes = [0xe3u8, 0x12].repeat(depth);
            bytes.extend_from_slice(&[0xe4u8, 0x12].repeat(depth));
            bytes
        };
        let fits: Vec<bool> = [99, 100, 101]
            .iter()
            .map(|&d| agree(&inner, &groups(d)))
            .collect();
        assert_eq!(fits, [true, true, false]);
    }

    /// Seeded mutations of valid messages (bytes flipped, cut, inserted,
    /// removed, spliced) and random bytes: the walk and the decode agree
    /// on every one, and both outcomes occur often.
    #[test]
    fn the_walk_agrees_with_a_decode_on_mutated_messages() {
        let pool = pool();
        let out = message(&pool, "t.Out");
        let seeds = valid(&out);
        let mut rng = ChaCha8Rng::seed_from_u64(27);
        let (mut fit, mut misfit) = (0, 0);
        for round in 0..20_000 {
            let mut bytes = seeds[1 + round % (seeds.len() - 1)].clone();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..=bytes.len());
                match rng.random_range(0..6) {
                    0 if at < bytes.len() => bytes[at] = rng.random(),
                    1 if at < bytes.len() => bytes[at] ^= 1 << rng.random_range(0..8),
                    2 => bytes.truncate(at),
                    3 => bytes.insert(at, rng.random()),
                    4 if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => {
                        let n = rng.random_range(0..8);
                        let noise: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                        bytes.splice(at..at, noise);
                    }
                }
            }
            if agree(&out, &bytes) {
                fit += 1;
            } else {
                misfit += 1;
            }
        }
        for _ in 0..5_000 {
            let n = rng.random_range(0..24);
            let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            if agree(&out, &bytes) {
                fit += 1;
            } else {
                misfit += 1;
            }
        }
        assert!(fit > 1_000 && misfit > 1_000, "fit {fit}, misfit {misfit}");
    }
}

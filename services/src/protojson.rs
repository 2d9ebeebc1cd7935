//! Protobuf's JSON mapping for messages known only at run time (a real
//! service's schema): JSON text to a [`DynamicMessage`], with errors that
//! name the field and the line and column of the JSON, and a message back
//! to JSON.
//!
//! Supported: every scalar type, enums by name or number, nested messages,
//! repeated fields, maps, `bytes` as base64 (standard or URL-safe, padding
//! optional), 64-bit integers as strings or numbers, `NaN` and
//! `Infinity` as strings, `null` for "not set". The well-known types whose
//! JSON form is not their message's (`Timestamp` as RFC 3339, `Duration`
//! as `"1.5s"`, the wrappers as their value, `Struct`, `Value`,
//! `ListValue`, `FieldMask`, and `Any` with its `@type` found in the
//! schema at hand) are read and written in those forms by prost-reflect's
//! own JSON mapping, which this parser hands the value to: an error there
//! is located at the value's start.

use std::collections::HashMap;

use base64::Engine as _;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};

/// Why a JSON text is not the message it should be: what is wrong, the
/// field it is wrong at (`a.b[2]`, empty for the message itself), and
/// where in the text (1-based line and column).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message} (line {line}, column {column})", field_prefix(.field))]
pub struct JsonError {
    /// The field's path from the top message; empty for the top message.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// 1-based line of the offending value.
    pub line: usize,
    /// 1-based column of the offending value.
    pub column: usize,
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("field `{field}`: ")
    }
}

/// A position in the JSON text (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    line: usize,
    column: usize,
}

/// A parsed JSON value and where it starts.
#[derive(Debug)]
struct Json {
    pos: Pos,
    value: JsonValue,
}

#[derive(Debug)]
enum JsonValue {
    Null,
    Bool(bool),
    /// The number's text, as written.
    Number(String),
    String(String),
    Array(Vec<Json>),
    /// Members in order, each with its key's position.
    Object(Vec<(String, Pos, Json)>),
}

impl JsonValue {
    fn kind(&self) -> &'static str {
        match self {
            JsonValue::Null => "null",
            JsonValue::Bool(_) => "a boolean",
            JsonValue::Number(_) => "a number",
            JsonValue::String(_) => "a string",
            JsonValue::Array(_) => "an array",
            JsonValue::Object(_) => "an object",
        }
    }
}

/// Parses `text` as the JSON form of a `desc` message.
pub fn parse_message(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, JsonError> {
    let json = Parser::new(text).document()?;
    let mut path = Vec::new();
    to_message(desc, &json, &mut path)
}

/// A JSON nesting deeper than this is refused (a stack guard).
const MAX_DEPTH: usize = 100;

struct Parser<'a> {
    text: &'a str,
    at: usize,
    line: usize,
    line_start: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text,
            at: 0,
            line: 1,
            line_start: 0,
            depth: 0,
        }
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            column: self.text[self.line_start..self.at].chars().count() + 1,
        }
    }

    fn error(&self, pos: Pos, message: impl Into<String>) -> JsonError {
        JsonError {
            field: String::new(),
            message: message.into(),
            line: pos.line,
            column: pos.column,
        }
    }

    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.line_start = self.at;
        }
        Some(c)
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.bump();
        }
    }

    fn document(mut self) -> Result<Json, JsonError> {
        let value = self.value()?;
        self.skip_space();
        if self.peek().is_some() {
            return Err(self.error(self.pos(), "unexpected text after the JSON value"));
        }
        Ok(value)
    }

    fn expect(&mut self, c: char) -> Result<(), JsonError> {
        self.skip_space();
        let pos = self.pos();
        match self.bump() {
            Some(got) if got == c => Ok(()),
            Some(got) => Err(self.error(pos, format!("expected `{c}`, found `{got}`"))),
            None => Err(self.error(pos, format!("expected `{c}`, found the end of the text"))),
        }
    }

    fn value(&mut self) -> Result<Json, JsonError> {
        self.skip_space();
        let pos = self.pos();
        let value = match self.peek() {
            None => return Err(self.error(pos, "expected a JSON value, found the end of the text")),
            Some('{') => self.nested(pos, Self::object)?,
            Some('[') => self.nested(pos, Self::array)?,
            Some('"') => JsonValue::String(self.string()?),
            Some('t') => self.word("true", JsonValue::Bool(true))?,
            Some('f') => self.word("false", JsonValue::Bool(false))?,
            Some('n') => self.word("null", JsonValue::Null)?,
            Some(c) if c == '-' || c.is_ascii_digit() => self.number()?,
            Some(c) => return Err(self.error(pos, format!("unexpected `{c}`"))),
        };
        Ok(Json { pos, value })
    }

    fn nested(
        &mut self,
        pos: Pos,
        parse: fn(&mut Self) -> Result<JsonValue, JsonError>,
    ) -> Result<JsonValue, JsonError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(pos, format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let value = parse(self);
        self.depth -= 1;
        value
    }

    fn word(&mut self, word: &str, value: JsonValue) -> Result<JsonValue, JsonError> {
        let pos = self.pos();
        if self.text[self.at..].starts_with(word) {
            for _ in 0..word.len() {
                self.bump();
            }
            Ok(value)
        } else {
            Err(self.error(pos, format!("expected `{word}`")))
        }
    }

    fn number(&mut self) -> Result<JsonValue, JsonError> {
        let pos = self.pos();
        let start = self.at;
        while matches!(self.peek(), Some(c) if c.is_ascii_digit() || "+-.eE".contains(c)) {
            self.bump();
        }
        let text = &self.text[start..self.at];
        if text.parse::<f64>().is_err() || text.starts_with('+') || text.ends_with('.') {
            return Err(self.error(pos, format!("`{text}` is not a JSON number")));
        }
        Ok(JsonValue::Number(text.to_owned()))
    }

    fn string(&mut self) -> Result<String, JsonError> {
        let start = self.pos();
        self.bump(); // the opening quote
        let mut out = String::new();
        loop {
            let pos = self.pos();
            match self.bump() {
                None => return Err(self.error(start, "unterminated string")),
                Some('"') => return Ok(out),
                Some('\\') => match self.bump() {
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('/') => out.push('/'),
                    Some('b') => out.push('\u{8}'),
                    Some('f') => out.push('\u{c}'),
                    Some('n') => out.push('\n'),
                    Some('r') => out.push('\r'),
                    Some('t') => out.push('\t'),
                    Some('u') => {
                        let high = self.hex4(pos)?;
                        let c = if (0xD800..0xDC00).contains(&high) {
                            if !self.text[self.at..].starts_with("\\u") {
                                return Err(self.error(pos, "a lone surrogate in `\\u` escape"));
                            }
                            self.bump();
                            self.bump();
                            let low = self.hex4(pos)?;
                            if !(0xDC00..0xE000).contains(&low) {
                                return Err(self.error(pos, "a lone surrogate in `\\u` escape"));
                            }
                            char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
                        } else {
                            char::from_u32(high)
                        };
                        out.push(c.ok_or_else(|| self.error(pos, "an invalid `\\u` escape"))?);
                    }
                    _ => return Err(self.error(pos, "an invalid escape")),
                },
                Some(c) if u32::from(c) < 0x20 => {
                    return Err(self.error(pos, "a control character in a string"));
                }
                Some(c) => out.push(c),
            }
        }
    }

    fn hex4(&mut self, pos: Pos) -> Result<u32, JsonError> {
        let digits = self.text.get(self.at..self.at + 4).unwrap_or_default();
        let value = (digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(digits, 16).ok())
            .flatten()
            .ok_or_else(|| self.error(pos, "`\\u` needs four hex digits"))?;
        for _ in 0..4 {
            self.bump();
        }
        Ok(value)
    }

    fn array(&mut self) -> Result<JsonValue, JsonError> {
        self.bump(); // [
        let mut items = Vec::new();
        self.skip_space();
        if self.peek() == Some(']') {
            self.bump();
            return Ok(JsonValue::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.skip_space();
            let pos = self.pos();
            match self.bump() {
                Some(',') => continue,
                Some(']') => return Ok(JsonValue::Array(items)),
                _ => return Err(self.error(pos, "expected `,` or `]` in an array")),
            }
        }
    }

    fn object(&mut self) -> Result<JsonValue, JsonError> {
        self.bump(); // {
        let mut members = Vec::new();
        self.skip_space();
        if self.peek() == Some('}') {
            self.bump();
            return Ok(JsonValue::Object(members));
        }
        loop {
            self.skip_space();
            let key_pos = self.pos();
            if self.peek() != Some('"') {
                return Err(self.error(key_pos, "expected a member name in double quotes"));
            }
            let key = self.string()?;
            self.expect(':')?;
            let value = self.value()?;
            members.push((key, key_pos, value));
            self.skip_space();
            let pos = self.pos();
            match self.bump() {
                Some(',') => continue,
                Some('}') => return Ok(JsonValue::Object(members)),
                _ => return Err(self.error(pos, "expected `,` or `}` in an object")),
            }
        }
    }
}

/// One step of a field path: a field name, a list index, a map key.
enum Step {
    Field(String),
    Index(usize),
    Key(String),
}

fn path_text(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(k) => out.push_str(&format!("[{k:?}]")),
        }
    }
    out
}

fn fail(path: &[Step], pos: Pos, message: impl Into<String>) -> JsonError {
    JsonError {
        field: path_text(path),
        message: message.into(),
        line: pos.line,
        column: pos.column,
    }
}

/// The well-known types whose JSON form is not the JSON of their message.
const WELL_KNOWN: &[&str] = &[
    "google.protobuf.Any",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "google.protobuf.FieldMask",
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
];

fn is_well_known(desc: &MessageDescriptor) -> bool {
    WELL_KNOWN.contains(&desc.full_name())
}

/// `json` as a well-known type's JSON form, read by prost-reflect's JSON
/// mapping (unknown fields refused); its error located at `json`'s start.
fn well_known(
    desc: &MessageDescriptor,
    json: &Json,
    path: &[Step],
) -> Result<DynamicMessage, JsonError> {
    DynamicMessage::deserialize(desc.clone(), plain_json(json)).map_err(|e| {
        fail(
            path,
            json.pos,
            format!("not a {} in its JSON form: {e}", desc.full_name()),
        )
    })
}

/// `json` as a `serde_json` value: numbers as written (a number serde_json
/// cannot hold is passed as its text, which the mapping then refuses).
fn plain_json(json: &Json) -> serde_json::Value {
    use serde_json::Value as J;
    match &json.value {
        JsonValue::Null => J::Null,
        JsonValue::Bool(b) => J::Bool(*b),
        JsonValue::Number(text) => text
            .parse::<serde_json::Number>()
            .map_or_else(|_| J::String(text.clone()), J::Number),
        JsonValue::String(text) => J::String(text.clone()),
        JsonValue::Array(items) => J::Array(items.iter().map(plain_json).collect()),
        JsonValue::Object(members) => J::Object(
            members
                .iter()
                .map(|(key, _, value)| (key.clone(), plain_json(value)))
                .collect(),
        ),
    }
}

fn to_message(
    desc: &MessageDescriptor,
    json: &Json,
    path: &mut Vec<Step>,
) -> Result<DynamicMessage, JsonError> {
    if is_well_known(desc) {
        return well_known(desc, json, path);
    }
    let JsonValue::Object(members) = &json.value else {
        return Err(fail(
            path,
            json.pos,
            format!(
                "expected an object ({}), found {}",
                desc.full_name(),
                json.value.kind()
            ),
        ));
    };
    let mut message = DynamicMessage::new(desc.clone());
    let mut seen: HashMap<u32, Pos> = HashMap::new();
    let mut oneofs: HashMap<String, String> = HashMap::new();
    for (key, key_pos, value) in members {
        let Some(field) = desc
            .get_field_by_json_name(key)
            .or_else(|| desc.get_field_by_name(key))
        else {
            let names: Vec<String> = desc.fields().map(|f| f.name().to_owned()).collect();
            return Err(fail(
                path,
                *key_pos,
                format!(
                    "{} has no field `{key}` (its fields: {})",
                    desc.full_name(),
                    names.join(", ")
                ),
            ));
        };
        path.push(Step::Field(field.name().to_owned()));
        if seen.insert(field.number(), *key_pos).is_some() {
            return Err(fail(path, *key_pos, "given twice"));
        }
        // `null` leaves a field unset, but for a `google.protobuf.Value`,
        // whose JSON null is a value.
        let holds_null =
            matches!(field.kind(), Kind::Message(m) if m.full_name() == "google.protobuf.Value");
        if matches!(value.value, JsonValue::Null) && !holds_null {
            path.pop();
            continue;
        }
        if let Some(oneof) = field.containing_oneof()
            && let Some(other) = oneofs.insert(oneof.name().to_owned(), field.name().to_owned())
        {
            return Err(fail(
                path,
                *key_pos,
                format!(
                    "`{other}` of the same oneof `{}` is set already",
                    oneof.name()
                ),
            ));
        }
        let v = field_value(&field, value, path)?;
        message.set_field(&field, v);
        path.pop();
    }
    Ok(message)
}

fn field_value(
    field: &FieldDescriptor,
    json: &Json,
    path: &mut Vec<Step>,
) -> Result<Value, JsonError> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(fail(path, json.pos, "a map field without an entry type"));
        };
        let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
        let JsonValue::Object(members) = &json.value else {
            return Err(fail(
                path,
                json.pos,
                format!("expected an object (a map), found {}", json.value.kind()),
            ));
        };
        let mut map = HashMap::with_capacity(members.len());
        for (key, key_pos, value) in members {
            path.push(Step::Key(key.clone()));
            let map_key = map_key(&key_field.kind(), key)
                .ok_or_else(|| fail(path, *key_pos, format!("`{key}` is not a valid map key")))?;
            let v = single(&value_field.kind(), value, path)?;
            if map.insert(map_key, v).is_some() {
                return Err(fail(path, *key_pos, "key given twice"));
            }
            path.pop();
        }
        Ok(Value::Map(map))
    } else if field.is_list() {
        let JsonValue::Array(items) = &json.value else {
            return Err(fail(
                path,
                json.pos,
                format!(
                    "expected an array (a repeated field), found {}",
                    json.value.kind()
                ),
            ));
        };
        let kind = field.kind();
        let mut list = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            path.push(Step::Index(i));
            list.push(single(&kind, item, path)?);
            path.pop();
        }
        Ok(Value::List(list))
    } else {
        single(&field.kind(), json, path)
    }
}

fn map_key(kind: &Kind, key: &str) -> Option<MapKey> {
    Some(match kind {
        Kind::String => MapKey::String(key.to_owned()),
        Kind::Bool => match key {
            "true" => MapKey::Bool(true),
            "false" => MapKey::Bool(false),
            _ => return None,
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => MapKey::I32(key.parse().ok()?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => MapKey::I64(key.parse().ok()?),
        Kind::Uint32 | Kind::Fixed32 => MapKey::U32(key.parse().ok()?),
        Kind::Uint64 | Kind::Fixed64 => MapKey::U64(key.parse().ok()?),
        _ => return None,
    })
}

/// One value (not a list or map) of kind `kind`.
fn single(kind: &Kind, json: &Json, path: &mut Vec<Step>) -> Result<Value, JsonError> {
    let pos = json.pos;
    let wrong = |what: &str| {
        fail(
            path,
            pos,
            format!("expected {what}, found {}", json.value.kind()),
        )
    };
    Ok(match kind {
        Kind::Message(desc) => Value::Message(to_message(desc, json, path)?),
        Kind::Enum(desc) => match &json.value {
            JsonValue::String(name) => {
                let value = desc.get_value_by_name(name).ok_or_else(|| {
                    let names: Vec<String> = desc.values().map(|v| v.name().to_owned()).collect();
                    fail(
                        path,
                        pos,
                        format!(
                            "`{name}` is not a value of {} ({})",
                            desc.full_name(),
                            names.join(", ")
                        ),
                    )
                })?;
                Value::EnumNumber(value.number())
            }
            JsonValue::Number(_) => Value::EnumNumber(integer(json, path, i32::try_from)?),
            _ => return Err(wrong("an enum value's name or number")),
        },
        Kind::Bool => match json.value {
            JsonValue::Bool(b) => Value::Bool(b),
            _ => return Err(wrong("true or false")),
        },
        Kind::String => match &json.value {
            JsonValue::String(s) => Value::String(s.clone()),
            _ => return Err(wrong("a string")),
        },
        Kind::Bytes => match &json.value {
            JsonValue::String(s) => Value::Bytes(
                decode_base64(s)
                    .ok_or_else(|| fail(path, pos, "not base64 (standard or URL-safe)"))?
                    .into(),
            ),
            _ => return Err(wrong("a base64 string")),
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            Value::I32(integer(json, path, i32::try_from)?)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            Value::I64(integer(json, path, i64::try_from)?)
        }
        Kind::Uint32 | Kind::Fixed32 => Value::U32(integer(json, path, u32::try_from)?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(integer(json, path, u64::try_from)?),
        Kind::Double => Value::F64(float(json, path)?),
        Kind::Float => {
            let f = float(json, path)?;
            #[allow(clippy::cast_possible_truncation)]
            let narrow = f as f32;
            if f.is_finite() && !narrow.is_finite() {
                return Err(fail(path, pos, format!("{f} is out of a float's range")));
            }
            Value::F32(narrow)
        }
    })
}

/// An integer given as a number or a string (`"12"`, `"-3"`, `"1e3"`),
/// converted to `T` by `convert`: anything fractional or out of range is
/// refused.
fn integer<T>(
    json: &Json,
    path: &[Step],
    convert: impl FnOnce(i128) -> Result<T, std::num::TryFromIntError>,
) -> Result<T, JsonError> {
    let text = match &json.value {
        JsonValue::Number(n) => n.as_str(),
        JsonValue::String(s) => s.trim(),
        other => {
            return Err(fail(
                path,
                json.pos,
                format!("expected an integer, found {}", other.kind()),
            ));
        }
    };
    let exact = text.parse::<i128>().ok().or_else(|| {
        // An exponent form of a whole number, e.g. 1e3.
        let f = text.parse::<f64>().ok()?;
        #[allow(clippy::cast_possible_truncation)]
        let whole = f as i128;
        (f.fract() == 0.0 && f.abs() < 1.8e19).then_some(whole)
    });
    let Some(n) = exact else {
        return Err(fail(path, json.pos, format!("`{text}` is not an integer")));
    };
    convert(n).map_err(|_| fail(path, json.pos, format!("{n} is out of the field's range")))
}

fn float(json: &Json, path: &[Step]) -> Result<f64, JsonError> {
    let parsed = match &json.value {
        JsonValue::Number(n) => n.parse::<f64>().ok(),
        JsonValue::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            s => s.parse::<f64>().ok().filter(|f| f.is_finite()),
        },
        other => {
            return Err(fail(
                path,
                json.pos,
                format!("expected a number, found {}", other.kind()),
            ));
        }
    };
    parsed.ok_or_else(|| fail(path, json.pos, "not a number"))
}

/// `text` as base64, standard or URL-safe, padded or not (what
/// protobuf's JSON mapping and gRPC's `-bin` metadata accept).
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let standard: String = text
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    engine.decode(standard).ok()
}

/// A message in protobuf's JSON mapping, every field shown (a field of a
/// oneof only when set): 64-bit integers as strings, bytes as base64,
/// enums by name (by number when the schema has no name for it).
pub fn to_json(message: &DynamicMessage) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    for field in message.descriptor().fields() {
        if field.containing_oneof().is_some() && !message.has_field(&field) {
            continue;
        }
        let value = message.get_field(&field);
        object.insert(
            field.json_name().to_owned(),
            value_json(&field.kind(), &value),
        );
    }
    serde_json::Value::Object(object)
}

fn value_json(kind: &Kind, value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Bool(b) => J::Bool(*b),
        Value::I32(n) => J::from(*n),
        Value::U32(n) => J::from(*n),
        Value::I64(n) => J::String(n.to_string()),
        Value::U64(n) => J::String(n.to_string()),
        Value::F32(f) => float_json(f64::from(*f)),
        Value::F64(f) => float_json(*f),
        Value::String(s) => J::String(s.clone()),
        Value::Bytes(b) => J::String(base64::engine::general_purpose::STANDARD.encode(b)),
        Value::EnumNumber(n) => match kind {
            Kind::Enum(desc) => desc
                .get_value(*n)
                .map_or_else(|| J::from(*n), |v| J::String(v.name().to_owned())),
            _ => J::from(*n),
        },
        Value::Message(m) if is_well_known(&m.descriptor()) => {
            let every_field = prost_reflect::SerializeOptions::new().skip_default_fields(false);
            m.serialize_with_options(serde_json::value::Serializer, &every_field)
                .unwrap_or_else(|_| to_json(m))
        }
        Value::Message(m) => to_json(m),
        Value::List(items) => J::Array(items.iter().map(|v| value_json(kind, v)).collect()),
        Value::Map(map) => {
            let value_kind = match kind {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other.clone(),
            };
            let mut entries: Vec<(String, serde_json::Value)> = map
                .iter()
                .map(|(k, v)| (map_key_text(k), value_json(&value_kind, v)))
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            J::Object(entries.into_iter().collect())
        }
    }
}

fn map_key_text(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

fn float_json(f: f64) -> serde_json::Value {
    if f.is_nan() {
        "NaN".into()
    } else if f == f64::INFINITY {
        "Infinity".into()
    } else if f == f64::NEG_INFINITY {
        "-Infinity".into()
    } else {
        serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, serde_json::Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost_reflect::DescriptorPool;
    use protox::file::{File, FileResolver};

    use super::*;

    const PROTO: &str = r#"
        syntax = "proto3";
        package t;
        enum Color { RED = 0; GREEN = 1; }
        message Inner { string name = 1; repeated int32 xs = 2; }
        message All {
          double d = 1; float f = 2; int32 i32 = 3; int64 i64 = 4;
          uint32 u32 = 5; uint64 u64 = 6; sint32 s32 = 7; sint64 s64 = 8;
          fixed32 fx32 = 9; fixed64 fx64 = 10; sfixed32 sf32 = 11; sfixed64 sf64 = 12;
          bool b = 13; string s = 14; bytes by = 15; Color color = 16;
          Inner inner = 17; repeated Inner inners = 18; map<string, int64> m = 19;
          map<int32, Inner> mi = 20; repeated Color colors = 21;
          oneof pick { string one = 22; int32 other = 23; }
          int32 snake_case_field = 24;
        }
    "#;

    struct Source;

    impl FileResolver for Source {
        fn open_file(&self, name: &str) -> Result<File, protox::Error> {
            if name == "t.proto" {
                File::from_source(name, PROTO)
            } else {
                Err(protox::Error::file_not_found(name))
            }
        }
    }

    fn all() -> MessageDescriptor {
        let mut compiler = protox::Compiler::with_file_resolver(Source);
        compiler.open_file("t.proto").expect("t.proto compiles");
        let pool: DescriptorPool = compiler.descriptor_pool();
        pool.get_message_by_name("t.All").expect("t.All")
    }

    fn err(text: &str) -> JsonError {
        parse_message(&all(), text).expect_err(text)
    }

    #[test]
    fn every_kind_of_field_reads_and_writes_back() {
        let text = r#"{
            "d": 1.5, "f": "-Infinity", "i32": -7, "i64": "-9007199254740993",
            "u32": "42", "u64": 18446744073709551615, "s32": -1, "s64": "5",
            "fx32": 1e3, "fx64": "7", "sf32": -3, "sf64": -4,
            "b": true, "s": "h\u00e9\ud83d\ude00\n", "by": "AQL_-w", "color": "GREEN",
            "inner": {"name": "n", "xs": [1, 2]}, "inners": [{}, {"name": "b"}],
            "m": {"k": "3"}, "mi": {"-2": {"name": "z"}}, "colors": ["RED", 1],
            "one": "x", "snakeCaseField": 9
        }"#;
        let message = parse_message(&all(), text).expect("a valid message");
        // It survives the wire.
        let decoded =
            DynamicMessage::decode(all(), message.encode_to_vec().as_slice()).expect("decodes");
        let json = to_json(&decoded);
        assert_eq!(json["d"], 1.5);
        assert_eq!(json["f"], "-Infinity");
        assert_eq!(json["i32"], -7);
        assert_eq!(json["i64"], "-9007199254740993");
        assert_eq!(json["u32"], 42);
        assert_eq!(json["u64"], "18446744073709551615");
        assert_eq!(json["fx32"], 1000);
        assert_eq!(json["sf64"], "-4");
        assert_eq!(json["b"], true);
        assert_eq!(json["s"], "h\u{e9}\u{1f600}\n");
        assert_eq!(json["by"], "AQL/+w==");
        assert_eq!(json["color"], "GREEN");
        assert_eq!(json["inner"]["xs"], serde_json::json!([1, 2]));
        assert_eq!(json["inners"][1]["name"], "b");
        assert_eq!(json["m"]["k"], "3");
        assert_eq!(json["mi"]["-2"]["name"], "z");
        assert_eq!(json["colors"], serde_json::json!(["RED", "GREEN"]));
        assert_eq!(json["one"], "x");
        assert!(
            json.get("other").is_none(),
            "an unset oneof member is left out"
        );
        assert_eq!(json["snakeCaseField"], 9);
        // The proto name is accepted too; null leaves a field unset.
        let message =
            parse_message(&all(), r#"{"snake_case_field": 1, "s": null}"#).expect("proto names");
        assert_eq!(to_json(&message)["snakeCaseField"], 1);
        assert_eq!(to_json(&message)["s"], "");
    }

    #[test]
    fn errors_name_the_field_line_and_column() {
        let e = err("{\n  \"inner\": {\"xs\": [1, \"x\"]}\n}");
        assert_eq!((e.field.as_str(), e.line, e.column), ("inner.xs[1]", 2, 23));
        let e = err(r#"{"u32": -1}"#);
        assert_eq!((e.field.as_str(), e.column), ("u32", 9));
        assert!(e.message.contains("out of the field's range"), "{e}");
        let e = err(r#"{"i32": 1.5}"#);
        assert!(e.message.contains("not an integer"), "{e}");
        let e = err(r#"{"color": "BLUE"}"#);
        assert!(e.message.contains("RED, GREEN"), "{e}");
        let e = err(r#"{"by": "%%"}"#);
        assert_eq!(e.field, "by");
        let e = err(r#"{"m": {"k": true}}"#);
        assert_eq!(e.field, "m[\"k\"]");
        let e = err(r#"{"mi": {"x": {}}}"#);
        assert!(e.message.contains("not a valid map key"), "{e}");
        let e = err(r#"{"one": "a", "other": 1}"#);
        assert!(e.message.contains("oneof"), "{e}");
        let e = err(r#"{"s": "a", "s": "b"}"#);
        assert!(e.message.contains("twice"), "{e}");
        let e = err(r#"{"nope": 1}"#);
        assert_eq!((e.field.as_str(), e.column), ("", 2));
        assert!(e.to_string().contains("t.All has no field `nope`"), "{e}");
        assert!(e.to_string().contains("(line 1, column 2)"), "{e}");
        let e = err(r#"{"inner": [1]}"#);
        assert!(e.message.contains("expected an object"), "{e}");
        let e = err("[]");
        assert!(e.message.contains("expected an object (t.All)"), "{e}");
    }

    #[test]
    fn malformed_json_is_refused_where_it_breaks() {
        for (text, line, column) in [
            ("", 1, 1),
            ("{", 1, 2),
            ("{\"s\": \"a\"", 1, 10),
            ("{\"s\" \"a\"}", 1, 6),
            ("{\n\"s\": tru}", 2, 6),
            ("{} x", 1, 4),
            ("{\"s\": \"\\q\"}", 1, 8),
            ("{\"s\": \"\\ud800\"}", 1, 8),
            ("{\"d\": 01.}", 1, 7),
            ("{'s': 1}", 1, 2),
        ] {
            let e = err(text);
            assert_eq!((e.line, e.column), (line, column), "{text:?}: {e}");
        }
        let deep = "[".repeat(200);
        assert!(err(&deep).message.contains("nested deeper"));
    }

    const WKT_PROTO: &str = r#"
        syntax = "proto3";
        package w;
        import "google/protobuf/any.proto";
        import "google/protobuf/duration.proto";
        import "google/protobuf/struct.proto";
        import "google/protobuf/timestamp.proto";
        import "google/protobuf/wrappers.proto";
        message Inner { string name = 1; }
        message Wkt {
          google.protobuf.Timestamp at = 1;
          google.protobuf.Duration took = 2;
          google.protobuf.Int64Value big = 3;
          google.protobuf.StringValue label = 4;
          google.protobuf.Struct attrs = 5;
          google.protobuf.Value nothing = 6;
          google.protobuf.Any boxed = 7;
          repeated google.protobuf.Timestamp ats = 8;
        }
    "#;

    fn wkt() -> MessageDescriptor {
        struct Wkt;
        impl FileResolver for Wkt {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                match name {
                    "w.proto" => File::from_source(name, WKT_PROTO),
                    _ => Err(protox::Error::file_not_found(name)),
                }
            }
        }
        let mut files = protox::file::ChainFileResolver::new();
        files.add(Wkt);
        files.add(protox::file::GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(files);
        compiler.open_file("w.proto").expect("w.proto compiles");
        compiler
            .descriptor_pool()
            .get_message_by_name("w.Wkt")
            .expect("w.Wkt")
    }

    #[test]
    fn well_known_types_are_read_and_written_in_their_json_forms() {
        let desc = wkt();
        let text = r#"{
            "at": "1972-01-01T10:00:20.021Z",
            "took": "1.500s",
            "big": "9007199254740993",
            "label": "hi",
            "attrs": {"k": [1, "two", null, {"x": true}]},
            "nothing": null,
            "boxed": {"@type": "type.googleapis.com/w.Inner", "name": "in"},
            "ats": ["2024-02-29T00:00:00Z"]
        }"#;
        let message = parse_message(&desc, text).unwrap_or_else(|e| panic!("{e}"));
        let field = |name: &str| {
            let Value::Message(m) = message.get_field_by_name(name).expect(name).into_owned()
            else {
                panic!("{name} is not a message");
            };
            m
        };
        let get =
            |m: &DynamicMessage, name: &str| m.get_field_by_name(name).expect(name).into_owned();
        let at = field("at");
        assert_eq!(
            (get(&at, "seconds"), get(&at, "nanos")),
            (Value::I64(63_108_020), Value::I32(21_000_000))
        );
        let took = field("took");
        assert_eq!(
            (get(&took, "seconds"), get(&took, "nanos")),
            (Value::I64(1), Value::I32(500_000_000))
        );
        assert_eq!(
            get(&field("big"), "value"),
            Value::I64(9_007_199_254_740_993)
        );
        assert!(message.has_field_by_name("nothing"), "null is a Value");
        // Written back in the same forms.
        let json = to_json(&message);
        assert_eq!(json["at"], "1972-01-01T10:00:20.021Z", "{json}");
        assert_eq!(json["took"], "1.500s", "{json}");
        assert_eq!(json["big"], "9007199254740993", "{json}");
        assert_eq!(json["label"], "hi", "{json}");
        assert_eq!(json["attrs"]["k"][3]["x"], true, "{json}");
        assert_eq!(json["nothing"], serde_json::Value::Null, "{json}");
        assert_eq!(
            json["boxed"]["@type"], "type.googleapis.com/w.Inner",
            "{json}"
        );
        assert_eq!(json["boxed"]["name"], "in", "{json}");
        assert_eq!(json["ats"][0], "2024-02-29T00:00:00Z", "{json}");
        // A value not in its form is refused where it starts.
        for (text, field, words) in [
            (
                r#"{"at": "yesterday"}"#,
                "at",
                "not a google.protobuf.Timestamp",
            ),
            (r#"{"took": 5}"#, "took", "not a google.protobuf.Duration"),
            (
                r#"{"boxed": {"@type": "type.googleapis.com/w.Nope"}}"#,
                "boxed",
                "not a google.protobuf.Any",
            ),
            (
                "{\n  \"ats\": [\"2024-02-30T00:00:00Z\"]}",
                "ats[0]",
                "not a google.protobuf.Timestamp",
            ),
        ] {
            let e = parse_message(&desc, text).expect_err(text);
            assert_eq!(e.field, field, "{text}: {e}");
            assert!(e.message.contains(words), "{text}: {e}");
        }
        let e =
            parse_message(&desc, "{\n  \"ats\": [\"2024-02-30T00:00:00Z\"]}").expect_err("Feb 30");
        assert_eq!((e.line, e.column), (2, 11), "{e}");
    }
}

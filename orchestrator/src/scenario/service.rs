//! `[hop.service]`: a real gRPC service as a hop's work. Where it is
//! (`address`) or how one is started per replica (`command`), the method,
//! the request (a JSON string or an inline table) or a streaming method's
//! requests (a JSON list or an array of tables) and its reply count, the
//! schema's `.proto` files, metadata, `ready_timeout`, and the container `image` a
//! deployment runs `command` in. Called from `validate::hop`; the
//! launchers that cannot start a service are refused in `validate`.

use std::path::PathBuf;

use super::error::Problems;
use super::model::{DEFAULT_SERVICE_READY_TIMEOUT, HopService, ServiceSource};
use super::read::Section;
use super::tree::{Entry, Node, Table, Value};
use tailmesh_services::model::Requests;

const SERVICE_KEYS: &[&str] = &[
    "address",
    "command",
    "method",
    "request",
    "requests",
    "replies",
    "proto",
    "proto_include",
    "metadata",
    "ready_timeout",
    "image",
    "direct",
    "layers",
];

/// The longest `ready_timeout`.
const MAX_READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Reads `[hop.service]` of a hop with `replicas` replicas.
pub(super) fn service(
    s: &Section<'_>,
    replicas: Option<u32>,
    p: &mut Problems,
) -> Option<HopService> {
    s.unknown_keys(p, SERVICE_KEYS);
    let source = match (s.get("address"), s.get("command")) {
        (Some(_), Some(_)) => {
            s.forbid(
                p,
                "command",
                "cannot go with address: give the address of a running service, or the \
                 command that starts one per replica, not both",
            );
            None
        }
        (None, None) => {
            p.at(
                s.span.start,
                format!(
                    "{}{} needs \"address\" (a running service, host:port) or \"command\" (the \
                     program that starts one per replica)",
                    s.prefix, s.label
                ),
            );
            None
        }
        (Some(_), None) => address(s, replicas, p).map(ServiceSource::Address),
        (None, Some(_)) => command(s, p).map(ServiceSource::Command),
    };
    let method =
        s.required(p, "method", Section::string)
            .and_then(|(m, e)| match method_problem(m) {
                None => Some(m.to_owned()),
                Some(why) => {
                    s.report(
                        p,
                        &e.node.span,
                        format!(
                            "{} = \"{m}\" is not a full method name: {why} (the form is \
                         \"package.Service/Method\")",
                            s.name("method")
                        ),
                    );
                    None
                }
            });
    let request = match (s.get("request"), s.get("requests")) {
        (Some(_), Some(_)) => {
            s.forbid(
                p,
                "requests",
                "cannot go with request: give one message as request, or a streaming \
                 method's messages in order as requests",
            );
            None
        }
        (None, None) => Some(Requests::One("{}".to_owned())),
        (Some(entry), None) => request(s, entry, p).map(Requests::One),
        (None, Some(entry)) => requests(s, entry, p).map(Requests::List),
    };
    let replies = match s.get("replies") {
        None => Some(None),
        Some(_) => s
            .int_in(p, "replies", 0, i64::from(u32::MAX))
            .and_then(|n| u32::try_from(n).ok())
            .map(Some),
    };
    let proto = paths(s, "proto", p);
    let proto_include = paths(s, "proto_include", p);
    if s.get("proto").is_none() && s.get("proto_include").is_some() {
        s.forbid(
            p,
            "proto_include",
            "needs proto (import paths for the .proto files named there)",
        );
    }
    let metadata = match s.get("metadata") {
        None => Some(Vec::new()),
        Some(entry) => metadata(s, entry, p),
    };
    let ready_timeout = match s.get("ready_timeout") {
        None => Some(DEFAULT_SERVICE_READY_TIMEOUT),
        Some(_) => s.positive_duration(p, "ready_timeout").and_then(|d| {
            if d <= MAX_READY_TIMEOUT {
                Some(d)
            } else {
                s.forbid(p, "ready_timeout", "must be at most 10m");
                None
            }
        }),
    };
    let image = match s.get("image") {
        None => Some(None),
        Some(_) if s.get("address").is_some() => {
            s.forbid(
                p,
                "image",
                "cannot go with address: a deployment calls an address as it is; image is \
                 where a deployment runs command",
            );
            None
        }
        Some(_) => image(s, p).map(Some),
    };
    let layers = match s.get("layers") {
        None => Some(false),
        Some(_) => s.boolean(p, "layers"),
    };
    if layers == Some(true) && s.get("address").is_some() {
        s.forbid(
            p,
            "layers",
            "cannot go with address: a run starts a layered service with its hop's \
             configuration and Control token (give command)",
        );
    }
    // A layered service is called directly: it is the hop.
    let direct = match (s.get("direct"), layers) {
        (None, layers) => layers,
        (Some(_), Some(true)) => match s.boolean(p, "direct") {
            Some(false) => {
                s.forbid(
                    p,
                    "direct",
                    "= false cannot go with layers = true: a service in tailmesh's layers is \
                     the hop itself, called directly (drop direct)",
                );
                None
            }
            direct => direct,
        },
        (Some(_), _) => s.boolean(p, "direct"),
    };
    Some(HopService {
        source: source?,
        method: method?,
        request: request?,
        replies: replies?,
        proto: proto?,
        proto_include: proto_include?,
        metadata: metadata?,
        ready_timeout: ready_timeout?,
        image: image?,
        direct: direct?,
        layers: layers?,
        dir: PathBuf::new(),
    })
}

/// Reports, at its key, `requests` or `replies` that a hop's method does
/// not take, where the method's kind can be known before the run: its
/// schema is in `.proto` files that compile. (Through reflection it is
/// known once the service answers: the hop's start refuses it then; so
/// does it a schema that does not compile or lacks the method.) `root` is
/// the scenario's tree, where the keys are found; each hop of `hops` (every
/// variant's) is checked once per hop and key.
pub(super) fn method_kinds<'a>(
    root: &Table,
    hops: impl IntoIterator<Item = &'a super::model::Hop>,
    p: &mut Problems,
) {
    let mut reported = std::collections::HashSet::new();
    for hop in hops {
        let Some(service) = &hop.service else {
            continue;
        };
        if service.proto.is_empty()
            || (matches!(service.request, Requests::One(_)) && service.replies.is_none())
        {
            continue;
        }
        let resolve = |paths: &[PathBuf]| -> Vec<PathBuf> {
            paths.iter().map(|p| service.resolve(p)).collect()
        };
        let Ok(kind) = tailmesh_services::hop::method_kind_in(
            &resolve(&service.proto),
            &resolve(&service.proto_include),
            &service.method,
        ) else {
            continue;
        };
        let Some((key, why)) = kind.refuses(&service.request, service.replies) else {
            continue;
        };
        if !reported.insert((hop.name.clone(), key)) {
            continue;
        }
        let message = format!(
            "hop \"{}\": service.{key} for {}: {why} (its kind, from {})",
            hop.name,
            service.method,
            service.schema_source()
        );
        match service_key_at(root, &hop.name, key) {
            Some(at) => p.at(at, message),
            None => p.nowhere(message),
        }
    }
}

/// Where `[hop.service]`'s `key` of the hop named `hop` is in `root`.
fn service_key_at(root: &Table, hop: &str, key: &str) -> Option<usize> {
    let Value::Array(hops) = &root.get("hop")?.node.value else {
        return None;
    };
    hops.iter().find_map(|node| {
        let Value::Table(table) = &node.value else {
            return None;
        };
        let named = matches!(&table.get("name")?.node.value, Value::String(n) if n == hop);
        let Value::Table(service) = &table.get("service")?.node.value else {
            return None;
        };
        named
            .then(|| service.get(key).map(|e| e.key_span.start))
            .flatten()
    })
}

/// `image = "name[:tag]"`: the container image `tailmesh compose` and
/// `tailmesh k8s` run `command` in, beside the replica's sidecar.
fn image(s: &Section<'_>, p: &mut Problems) -> Option<String> {
    let (image, entry) = s.string(p, "image")?;
    let why = if image.is_empty() {
        Some("is empty")
    } else if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("has a space or a control character")
    } else if image.starts_with(['-', ':', '/', '@']) {
        Some("must start with a letter or digit")
    } else {
        None
    };
    match why {
        None => Some(image.to_owned()),
        Some(why) => {
            s.report(
                p,
                &entry.node.span,
                format!(
                    "{} = \"{image}\" {why}: give an image reference (for example \
                     \"tailmesh-example-python:latest\")",
                    s.name("image")
                ),
            );
            None
        }
    }
}

/// The hop keys that need a tailmesh hop in front of the service, and why,
/// for a hop whose service is called directly (`replica_slow` is refused
/// beside any service).
const SIDECAR_KEYS: &[(&str, &str)] = &[
    (
        "transport",
        "a direct service is called by push; a broker needs a tailmesh worker",
    ),
    ("concurrency", "slots are a tailmesh hop's"),
    ("queue_limit", "the queue is a tailmesh hop's"),
    ("discipline", "the queue is a tailmesh hop's"),
    ("worker_ping", "it is a pull worker's"),
    ("balance", "its callers take its replicas in turn"),
    ("connection", "its callers share one connection per replica"),
    ("slow", "injected slowness is done by a tailmesh hop"),
    ("error", "injected errors are answered by a tailmesh hop"),
    (
        "net",
        "network faults need the netns launcher, which does not start services",
    ),
    (
        "replica_net",
        "network faults need the netns launcher, which does not start services",
    ),
    ("kill", "kill is not supported for a direct service"),
    (
        "streaming",
        "a stream's messages are taken by a tailmesh hop, which calls the service once per \
         message",
    ),
    (
        "health",
        "its callers do not watch a direct service's health",
    ),
    (
        "backoff",
        "its callers do not watch a direct service's health",
    ),
    ("keepalive", "its callers do not ping a direct service"),
    (
        "keepalive_timeout",
        "its callers do not ping a direct service",
    ),
    ("ewma", "its callers take its replicas in turn"),
    (
        "ejection",
        "its callers do not eject a direct service's replicas",
    ),
];

/// The keys of [`SIDECAR_KEYS`] a service in tailmesh's serving layers
/// (`layers = true`) does itself: its slot and its application faults.
const LAYERED_KEYS: &[&str] = &["concurrency", "queue_limit", "discipline", "slow", "error"];

/// Reports each key of the hop `s` that needs a tailmesh hop in front of
/// its service, when `[hop.service] direct = true` puts none there (or
/// `layers = true`, whose service does some of them itself).
pub(super) fn refuse_beside_direct(s: &Section<'_>, layers: bool, p: &mut Problems) {
    for (key, why) in SIDECAR_KEYS {
        let push =
            matches!(s.get(key).map(|e| &e.node.value), Some(Value::String(v)) if v == "push");
        if *key == "transport" && push || layers && LAYERED_KEYS.contains(key) {
            continue;
        }
        if s.get(key).is_some() {
            let message = if layers {
                format!(
                    "cannot go with service.layers = true: {why} (a layered service does its \
                     slot and its slow and error faults itself; drop layers to put a tailmesh \
                     hop in front of the service)"
                )
            } else {
                format!(
                    "cannot go with service.direct = true: {why} (drop direct to put a tailmesh \
                     hop in front of the service)"
                )
            };
            s.forbid(p, key, &message);
        }
    }
}

/// Reports `[load] connection = "per_request"` when an entry hop's service
/// is called directly: the load generator keeps one channel per replica
/// (times `connections`) to a direct service.
pub(super) fn direct_entry_fits_the_load(
    top: &Section<'_>,
    hops: &[super::model::Hop],
    load: &super::model::Load,
    p: &mut Problems,
) {
    if load.connection != super::model::ConnectionMode::PerRequest {
        return;
    }
    let direct = load
        .entry_hops(hops)
        .into_iter()
        .filter_map(|(i, _)| hops.get(i))
        .find(|h| h.service.as_ref().is_some_and(|s| s.direct));
    let Some(hop) = direct else {
        return;
    };
    let at = match top.get("load").map(|e| &e.node.value) {
        Some(Value::Table(t)) => t.get("connection").map(|e| e.key_span.start),
        _ => None,
    };
    if let Some(at) = at {
        p.at(
            at,
            format!(
                "load.connection = \"per_request\" cannot go with an entry hop \"{}\" whose \
                 service is called directly (service.direct = true): the load generator keeps \
                 its connections to a direct service (use connections = N)",
                hop.name
            ),
        );
    }
}

/// `address = "host:port"`, for a hop of one replica.
fn address(s: &Section<'_>, replicas: Option<u32>, p: &mut Problems) -> Option<String> {
    let (address, entry) = s.string(p, "address")?;
    let valid = address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|port| port > 0)
    });
    if !valid {
        s.report(
            p,
            &entry.node.span,
            format!(
                "{} = \"{address}\" is not host:port (for example \"127.0.0.1:50051\")",
                s.name("address")
            ),
        );
        return None;
    }
    if let Some(n) = replicas.filter(|&n| n > 1) {
        s.report(
            p,
            &entry.key_span,
            format!(
                "{} serves one replica, and the hop has replicas = {n}: use command, which \
                 starts a service per replica",
                s.name("address")
            ),
        );
        return None;
    }
    Some(address.to_owned())
}

/// `command = ["program", "arg", "{port}"]`.
fn command(s: &Section<'_>, p: &mut Problems) -> Option<Vec<String>> {
    let entry = s.get("command")?;
    let Value::Array(items) = &entry.node.value else {
        s.wrong_type(
            p,
            entry,
            "an array of strings (the program and its arguments)",
        );
        return None;
    };
    let mut words = Vec::with_capacity(items.len());
    for item in items {
        match &item.value {
            Value::String(word) => words.push(word.clone()),
            other => {
                s.report(
                    p,
                    &item.span,
                    format!(
                        "expected strings in {}, got {}",
                        s.name("command"),
                        other.kind()
                    ),
                );
                return None;
            }
        }
    }
    match words.first() {
        None => {
            s.report(
                p,
                &entry.node.span,
                format!("{} needs at least the program", s.name("command")),
            );
            None
        }
        Some(program) if program.trim().is_empty() => {
            s.report(
                p,
                &items[0].span,
                format!("{}'s program is empty", s.name("command")),
            );
            None
        }
        Some(_) => Some(words),
    }
}

/// Why `method` is not `package.Service/Method`, if it is not.
fn method_problem(method: &str) -> Option<&'static str> {
    let Some((service, name)) = method.split_once('/') else {
        return Some("it has no '/' between the service and the method");
    };
    if name.contains('/') {
        return Some("it has more than one '/'");
    }
    if service.is_empty() {
        return Some("the service before '/' is empty");
    }
    if !service.split('.').all(is_identifier) {
        return Some(
            "the service must be dot-separated identifiers (letters, digits, '_', not \
             starting with a digit)",
        );
    }
    if !is_identifier(name) {
        return Some(
            "the method after '/' must be an identifier (letters, digits, '_', not starting \
             with a digit)",
        );
    }
    None
}

fn is_identifier(word: &str) -> bool {
    let mut chars = word.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `request`: a JSON object in a string, or an inline table converted to
/// JSON.
fn request(s: &Section<'_>, entry: &Entry, p: &mut Problems) -> Option<String> {
    match &entry.node.value {
        Value::String(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(_)) => Some(text.clone()),
            Ok(other) => {
                let hint = if other.is_array() {
                    " (a streaming method's messages go in requests)"
                } else {
                    ""
                };
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be a JSON object (the request message), got {}{hint}",
                        s.name("request"),
                        json_kind(&other)
                    ),
                );
                None
            }
            Err(e) => {
                not_json(s, "request", entry, &e, p);
                None
            }
        },
        Value::Table(table) => {
            let mut ok = true;
            let json = table_json(s, "request", table, p, &mut ok);
            ok.then(|| json.to_string())
        }
        _ => {
            s.wrong_type(p, entry, "a JSON string or a table (the request message)");
            None
        }
    }
}

/// `requests`: a streaming method's messages in order, as a JSON list of
/// objects in a string or an array of tables; at least one.
fn requests(s: &Section<'_>, entry: &Entry, p: &mut Problems) -> Option<Vec<String>> {
    let messages = match &entry.node.value {
        Value::String(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    if item.is_object() {
                        out.push(item.to_string());
                    } else {
                        s.report(
                            p,
                            &entry.node.span,
                            format!(
                                "{}[{i}] must be a JSON object (a request message), got {}",
                                s.name("requests"),
                                json_kind(item)
                            ),
                        );
                        return None;
                    }
                }
                out
            }
            Ok(other) => {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be a JSON list of objects (the request messages), got {}",
                        s.name("requests"),
                        json_kind(&other)
                    ),
                );
                return None;
            }
            Err(e) => {
                not_json(s, "requests", entry, &e, p);
                return None;
            }
        },
        Value::Array(items) => {
            let mut ok = true;
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match &item.value {
                    Value::Table(table) => {
                        out.push(table_json(s, "requests", table, p, &mut ok).to_string());
                    }
                    other => {
                        ok = false;
                        s.report(
                            p,
                            &item.span,
                            format!(
                                "{}[{i}] must be a table (a request message), got {}",
                                s.name("requests"),
                                other.kind()
                            ),
                        );
                    }
                }
            }
            if !ok {
                return None;
            }
            out
        }
        _ => {
            s.wrong_type(
                p,
                entry,
                "a JSON list in a string or an array of tables (the request messages)",
            );
            return None;
        }
    };
    if messages.is_empty() {
        s.report(
            p,
            &entry.node.span,
            format!(
                "{} needs at least one message (a stream of none sends nothing to check)",
                s.name("requests")
            ),
        );
        return None;
    }
    Some(messages)
}

/// Reports `key`'s string as not JSON, where serde_json stopped.
fn not_json(s: &Section<'_>, key: &str, entry: &Entry, e: &serde_json::Error, p: &mut Problems) {
    s.report(
        p,
        &entry.node.span,
        format!(
            "{} is not JSON: {e} (line and column within the string)",
            s.name(key)
        ),
    );
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `table`, a request message under `key`, as a JSON object.
fn table_json(
    s: &Section<'_>,
    key: &str,
    table: &Table,
    p: &mut Problems,
    ok: &mut bool,
) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    for entry in &table.entries {
        object.insert(entry.key.clone(), node_json(s, key, &entry.node, p, ok));
    }
    serde_json::Value::Object(object)
}

fn node_json(
    s: &Section<'_>,
    key: &str,
    node: &Node,
    p: &mut Problems,
    ok: &mut bool,
) -> serde_json::Value {
    match &node.value {
        Value::String(text) => serde_json::Value::String(text.clone()),
        Value::Integer(i) => serde_json::Value::from(*i),
        Value::Boolean(b) => serde_json::Value::Bool(*b),
        Value::Float(f) => match serde_json::Number::from_f64(*f) {
            Some(n) => serde_json::Value::Number(n),
            None => {
                *ok = false;
                s.report(
                    p,
                    &node.span,
                    format!("{} cannot hold {f}: JSON has no such number", s.name(key)),
                );
                serde_json::Value::Null
            }
        },
        Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(|n| node_json(s, key, n, p, ok)).collect())
        }
        Value::Table(table) => table_json(s, key, table, p, ok),
        Value::Datetime => {
            *ok = false;
            s.report(
                p,
                &node.span,
                format!(
                    "{} cannot hold a TOML datetime: write a google.protobuf.Timestamp as a \
                     string (\"1972-01-01T10:00:20.021Z\")",
                    s.name(key)
                ),
            );
            serde_json::Value::Null
        }
        Value::Invalid => {
            *ok = false;
            serde_json::Value::Null
        }
    }
}

/// `proto` or `proto_include`: an array of paths.
fn paths(s: &Section<'_>, key: &str, p: &mut Problems) -> Option<Vec<PathBuf>> {
    let Some(entry) = s.get(key) else {
        return Some(Vec::new());
    };
    let Value::Array(items) = &entry.node.value else {
        s.wrong_type(p, entry, "an array of paths");
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        match &item.value {
            Value::String(path) if !path.is_empty() => out.push(PathBuf::from(path)),
            other => {
                ok = false;
                s.report(
                    p,
                    &item.span,
                    format!(
                        "expected paths (non-empty strings) in {}, got {}",
                        s.name(key),
                        other.kind()
                    ),
                );
            }
        }
    }
    ok.then_some(out)
}

/// `metadata = { key = "value" }`: gRPC metadata keys (lowercase ASCII
/// letters, digits, '-', '_', '.'; not `grpc-`, which gRPC reserves) and
/// printable ASCII values; a binary key's (`-bin`) value is its bytes in
/// base64.
fn metadata(s: &Section<'_>, entry: &Entry, p: &mut Problems) -> Option<Vec<(String, String)>> {
    let Value::Table(table) = &entry.node.value else {
        s.wrong_type(p, entry, "a table of strings ({ key = \"value\" })");
        return None;
    };
    let mut out = Vec::with_capacity(table.entries.len());
    let mut ok = true;
    for e in &table.entries {
        let key = &e.key;
        let key_problem = if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        {
            Some("a metadata key holds lowercase ASCII letters, digits, '-', '_' and '.'")
        } else if key.starts_with("grpc-") {
            Some("keys starting with \"grpc-\" are reserved by gRPC")
        } else if matches!(
            key.as_str(),
            "te" | "content-type" | "user-agent" | "traceparent"
        ) {
            Some("this key is set by the hop itself")
        } else {
            None
        };
        if let Some(why) = key_problem {
            ok = false;
            s.report(
                p,
                &e.key_span,
                format!("{}.{key}: {why}", s.name("metadata")),
            );
            continue;
        }
        match &e.node.value {
            Value::String(v)
                if key.ends_with("-bin")
                    && tailmesh_services::protojson::decode_base64(v).is_none() =>
            {
                ok = false;
                s.report(
                    p,
                    &e.node.span,
                    format!(
                        "{}.{key} is binary metadata (a -bin key): its value is its bytes in \
                         base64, standard or URL-safe",
                        s.name("metadata")
                    ),
                );
            }
            Value::String(v) if v.bytes().all(|b| (0x20..0x7f).contains(&b)) => {
                out.push((key.clone(), v.clone()));
            }
            Value::String(_) => {
                ok = false;
                s.report(
                    p,
                    &e.node.span,
                    format!(
                        "{}.{key} must be printable ASCII (gRPC metadata values)",
                        s.name("metadata")
                    ),
                );
            }
            other => {
                ok = false;
                s.report(
                    p,
                    &e.node.span,
                    format!(
                        "expected a string for {}.{key}, got {}",
                        s.name("metadata"),
                        other.kind()
                    ),
                );
            }
        }
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::method_problem;
    use crate::scenario::{ServiceSource, parse};
    use tailmesh_services::model::Requests;

    const HEAD: &str = "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 1\nrequests = 5\n[[hop]]\nname = \"b\"\n[hop.service]\nmethod = \"p.v1.S/M\"\n";

    fn service(keys: &str) -> crate::scenario::HopService {
        let scenario = parse(&format!("{HEAD}{keys}"), "t.toml").unwrap_or_else(|e| panic!("{e}"));
        scenario.variants[0].hops[0]
            .service
            .clone()
            .expect("the hop has a service")
    }

    #[test]
    fn a_request_table_becomes_json_and_a_string_stays_as_written() {
        let s = service(
            "command = [\"srv\", \"{port}\"]\nrequest = { message = \"hi\", n = 3, f = 0.5, ok = true, tags = [\"a\", \"b\"], inner = { x = -1 } }\n",
        );
        let Requests::One(request) = &s.request else {
            panic!("one request: {:?}", s.request);
        };
        let json: serde_json::Value = serde_json::from_str(request).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({
                "message": "hi", "n": 3, "f": 0.5, "ok": true,
                "tags": ["a", "b"], "inner": { "x": -1 }
            })
        );
        assert_eq!(
            s.source,
            ServiceSource::Command(vec!["srv".into(), "{port}".into()])
        );
        assert_eq!(
            s.ready_timeout,
            crate::scenario::DEFAULT_SERVICE_READY_TIMEOUT
        );

        let s = service(
            "address = \"localhost:50051\"\nrequest = '{\"message\": \"hi\"}'\nmetadata = { tenant = \"t1\", a-b = \"2\" }\n",
        );
        assert_eq!(s.request, "{\"message\": \"hi\"}".into());
        assert_eq!(s.source, ServiceSource::Address("localhost:50051".into()));
        assert_eq!(
            s.metadata,
            [("tenant".into(), "t1".into()), ("a-b".into(), "2".into())]
        );
        assert_eq!(service("address = \"h:1\"\n").request, "{}".into());
        assert_eq!(service("address = \"h:1\"\n").image, None);
        assert_eq!(
            service("command = [\"srv\"]\nimage = \"team/echo:1.2\"\n").image,
            Some("team/echo:1.2".to_owned())
        );
    }

    /// Asserts that each case's service `keys` are refused at `at` (file,
    /// line, column) with `words`.
    fn refused_at(cases: &[(&str, &str, &str)]) {
        for (keys, at, words) in cases {
            let errors = match parse(&format!("{HEAD}{keys}"), "t.toml") {
                Ok(_) => panic!("accepted: {keys}"),
                Err(e) => e.to_string(),
            };
            assert!(
                errors.contains(at) && errors.contains(words),
                "{keys}: expected {words:?} at {at}:\n{errors}"
            );
        }
    }

    #[test]
    fn bad_values_are_reported_at_the_value() {
        refused_at(&[
            ("address = \"nohost\"\n", "t.toml:10:11", "not host:port"),
            ("address = \"h:0\"\n", "t.toml:10:11", "not host:port"),
            ("command = []\n", "t.toml:10:11", "at least the program"),
            (
                "command = [\"srv\", 1]\n",
                "t.toml:10:19",
                "expected strings",
            ),
            (
                "command = [\"x\"]\nrequest = '[1]'\n",
                "t.toml:11:11",
                "must be a JSON object",
            ),
            (
                "command = [\"x\"]\nrequest = 3\n",
                "t.toml:11:11",
                "a JSON string or a table",
            ),
            (
                "command = [\"x\"]\nmetadata = { grpc-x = \"1\" }\n",
                "t.toml:11:14",
                "reserved",
            ),
            (
                "command = [\"x\"]\nmetadata = { Up = \"1\" }\n",
                "t.toml:11:14",
                "lowercase",
            ),
            (
                "command = [\"x\"]\nproto_include = [\"d\"]\n",
                "t.toml:11:1",
                "needs proto",
            ),
            (
                "command = [\"x\"]\nimage = \"a b\"\n",
                "t.toml:11:9",
                "has a space",
            ),
            (
                "command = [\"x\"]\nimage = \"\"\n",
                "t.toml:11:9",
                "is empty",
            ),
            (
                "address = \"h:1\"\nimage = \"img\"\n",
                "t.toml:11:1",
                "image cannot go with address",
            ),
            ("command = [\"x\"]\nimage = 3\n", "t.toml:11:9", "string"),
            (
                "command = [\"x\"]\nready_timeout = \"0s\"\n",
                "t.toml:11:17",
                "greater than 0",
            ),
        ]);
    }

    #[test]
    fn requests_are_a_list_of_messages_and_replies_a_count() {
        let s = service(
            "command = [\"x\"]\nrequests = [{ message = \"a\" }, { message = \"b\", work_us = 5 }]\n\
             replies = 2\n",
        );
        assert_eq!(
            s.request,
            Requests::List(vec![
                r#"{"message":"a"}"#.to_owned(),
                r#"{"message":"b","work_us":5}"#.to_owned()
            ])
        );
        assert_eq!(s.replies, Some(2));
        let s = service("command = [\"x\"]\nrequests = '[{\"message\": \"a\"}, {}]'\n");
        assert_eq!(
            s.request,
            Requests::List(vec![r#"{"message":"a"}"#.to_owned(), "{}".to_owned()])
        );
        assert_eq!(s.replies, None);
        refused_at(&[
            (
                "command = [\"x\"]\nrequest = '{}'\nrequests = '[{}]'\n",
                "t.toml:12:1",
                "requests cannot go with request",
            ),
            (
                "command = [\"x\"]\nrequests = '[]'\n",
                "t.toml:11:12",
                "at least one message",
            ),
            (
                "command = [\"x\"]\nrequests = []\n",
                "t.toml:11:12",
                "at least one message",
            ),
            (
                "command = [\"x\"]\nrequests = '{}'\n",
                "t.toml:11:12",
                "must be a JSON list of objects",
            ),
            (
                "command = [\"x\"]\nrequests = '[{}, 2]'\n",
                "t.toml:11:12",
                "requests[1] must be a JSON object",
            ),
            (
                "command = [\"x\"]\nrequests = '[{'\n",
                "t.toml:11:12",
                "is not JSON",
            ),
            (
                "command = [\"x\"]\nrequests = [{}, \"b\"]\n",
                "t.toml:11:17",
                "requests[1] must be a table",
            ),
            (
                "command = [\"x\"]\nrequests = 3\n",
                "t.toml:11:12",
                "a JSON list in a string or an array of tables",
            ),
            (
                "command = [\"x\"]\nrequest = '[{}]'\n",
                "t.toml:11:11",
                "a streaming method's messages go in requests",
            ),
            (
                "command = [\"x\"]\nreplies = -1\n",
                "t.toml:11:11",
                "replies",
            ),
            (
                "command = [\"x\"]\nreplies = \"2\"\n",
                "t.toml:11:11",
                "replies",
            ),
        ]);
    }

    #[test]
    fn work_and_replica_slow_are_refused_beside_a_service() {
        let text = "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 1\nrequests = 5\n\
                    [[hop]]\nname = \"b\"\nreplicas = 2\nreplica_slow = { replica = 1, factor = 3 }\n\
                    work = { kind = \"sleep\", value = \"1ms\" }\n\
                    [hop.service]\ncommand = [\"x\"]\nmethod = \"p.S/M\"\n";
        let errors = match parse(text, "t.toml") {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            errors.contains("t.toml:9:1: hop \"b\": replica_slow cannot go with service"),
            "{errors}"
        );
        assert!(
            errors.contains("t.toml:10:1: hop \"b\": work cannot go with service"),
            "{errors}"
        );
    }

    #[test]
    fn method_names_are_package_service_slash_method() {
        for good in [
            "p.S/M",
            "S/M",
            "tailmesh.examples.v1.Echo/Echo",
            "_a.b_2/C3",
        ] {
            assert_eq!(method_problem(good), None, "{good}");
        }
        for bad in [
            "p.S.M", "/p.S/M", "p.S/", "p.S/M/N", "p..S/M", "1p.S/M", "p.S/M-x",
        ] {
            assert!(method_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn paths_are_the_scenario_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            format!("{HEAD}command = [\"srv\"]\nproto = [\"a.proto\", \"/abs/b.proto\"]\n"),
        )
        .expect("written");
        let (scenario, _) = crate::scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let s = scenario.variants[0].hops[0]
            .service
            .clone()
            .expect("a service");
        assert_eq!(s.dir, dir.path());
        assert_eq!(s.resolve(&s.proto[0]), dir.path().join("a.proto"));
        assert_eq!(s.resolve(&s.proto[1]), Path::new("/abs/b.proto"));
        assert_eq!(s.schema_source(), "proto: a.proto, /abs/b.proto");
    }

    /// The problems of a scenario whose hop `b` has `hop_keys` and whose
    /// service has `service_keys`, then `tail`.
    fn problems(hop_keys: &str, service_keys: &str, tail: &str) -> Vec<String> {
        let text = format!(
            "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 1\nrequests = 5\n[[hop]]\n\
             name = \"b\"\n{hop_keys}[hop.service]\nmethod = \"p.v1.S/M\"\n{service_keys}{tail}"
        );
        match parse(&text, "t.toml") {
            Ok(_) => Vec::new(),
            Err(e) => e.errors.into_iter().map(|e| e.message).collect(),
        }
    }

    #[test]
    fn a_layered_service_is_called_directly_and_keeps_its_slot_and_faults() {
        let s = service("command = [\"srv\", \"{port}\"]\nlayers = true\n");
        assert!(s.layers && s.direct);
        assert!(s.call(String::new()).layered);
        let plain = service("command = [\"srv\"]\ndirect = true\n");
        assert!(plain.direct && !plain.layers && !plain.call(String::new()).layered);
        let keys = "concurrency = 4\nqueue_limit = 8\nslow = { probability = 0.1, extra = \"5ms\" }\n\
                    error = { probability = 0.01, code = \"unavailable\" }\n";
        let layered = "command = [\"srv\"]\nlayers = true\n";
        assert_eq!(problems(keys, layered, ""), Vec::<String>::new());
        // The same keys need a tailmesh hop beside a plain direct service.
        let direct = problems(keys, "command = [\"srv\"]\ndirect = true\n", "");
        assert_eq!(direct.len(), 4, "{direct:?}");
        assert!(direct.iter().all(|m| m.contains("service.direct = true")));
    }

    #[test]
    fn requests_or_replies_the_methods_kind_refuses_are_located_when_its_schema_is_in_files() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers/echo.proto");
        let load = |method: &str, keys: &str, proto: &Path| {
            let text = format!(
                "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 1\nrequests = 5\n\
                 [[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"x\"]\n\
                 method = \"tailmesh.examples.v1.Echo/{method}\"\nproto = [{:?}]\n{keys}",
                proto.display().to_string()
            );
            let path = dir.path().join("s.toml");
            std::fs::write(&path, text).expect("write the scenario");
            crate::scenario::load(&path)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let refused = load("Echo", "requests = [{}]\n", &proto).expect_err("unary");
        assert!(
            refused.contains("s.toml:12:1")
                && refused.contains(
                    "hop \"b\": service.requests for tailmesh.examples.v1.Echo/Echo: a unary \
                     method takes one request message; give it as request"
                ),
            "{refused}"
        );
        let refused = load(
            "EchoClientStream",
            "requests = [{}, {}]\nreplies = 1\n",
            &proto,
        )
        .expect_err("one reply");
        assert!(
            refused.contains("s.toml:13:1")
                && refused
                    .contains("service.replies for tailmesh.examples.v1.Echo/EchoClientStream"),
            "{refused}"
        );
        let refused =
            load("EchoServerStream", "requests = [{}, {}]\n", &proto).expect_err("one request");
        assert!(refused.contains("not a list of 2"), "{refused}");
        // What the kind takes; and what only the hop's start can tell (no
        // such file, no such method).
        for (method, keys, proto) in [
            (
                "EchoStream",
                "requests = [{}, {}]\nreplies = 2\n",
                proto.as_path(),
            ),
            ("EchoServerStream", "requests = [{}]\nreplies = 3\n", &proto),
            (
                "Echo",
                "requests = [{}]\n",
                Path::new("/nowhere/echo.proto"),
            ),
            ("Shout", "requests = [{}]\n", &proto),
        ] {
            assert_eq!(load(method, keys, proto), Ok(()), "{method} {keys}");
        }
    }

    #[test]
    fn a_streaming_hop_calls_its_service_per_message_but_not_directly() {
        let cmd = "command = [\"x\"]\n";
        for kind in ["bidi", "server"] {
            let hop = format!("streaming = \"{kind}\"\n");
            assert_eq!(problems(&hop, cmd, ""), Vec::<String>::new(), "{kind}");
            let found = problems(&hop, &format!("{cmd}direct = true\n"), "");
            assert!(
                found.len() == 1
                    && found[0].contains("streaming cannot go with service.direct = true"),
                "{kind}: {found:?}"
            );
        }
    }

    #[test]
    fn what_a_layered_service_cannot_do_is_refused_with_why() {
        let cmd = "command = [\"srv\"]\n";
        let found = problems("", "address = \"127.0.0.1:1\"\nlayers = true\n", "");
        assert!(
            found.len() == 1 && found[0].contains("layers cannot go with address"),
            "{found:?}"
        );
        let found = problems("", &format!("{cmd}layers = true\ndirect = false\n"), "");
        assert!(
            found.len() == 1 && found[0].contains("= false cannot go with layers = true"),
            "{found:?}"
        );
        let found = problems(
            "replica_slow = { replica = 0, factor = 3 }\ntransport = \"pull\"\n",
            &format!("{cmd}layers = true\n"),
            "",
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .any(|m| m.contains("transport cannot go with service.layers = true"))
                && found
                    .iter()
                    .any(|m| m.contains("replica_slow cannot go with service:")),
            "{found:?}"
        );
        let found = problems(
            "downstream = [\"c\"]\n",
            &format!("{cmd}layers = true\n"),
            "[[hop]]\nname = \"c\"\n",
        );
        assert!(
            found.len() == 1
                && found[0].contains("has service.layers = true, so it must be a leaf"),
            "{found:?}"
        );
        let found = problems("", &format!("{cmd}layers = \"yes\"\n"), "");
        assert_eq!(found.len(), 1, "{found:?}");
    }
}

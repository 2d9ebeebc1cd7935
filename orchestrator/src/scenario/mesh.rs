//! `[mesh]`: how every link of the mesh is secured (`tls`) and whether
//! clients resume TLS sessions (`tls_resumption`).

use tailmesh_services::{
    model::{BrokerKind, Transport},
    tls::TlsMode,
};

use super::error::Problems;
use super::model::{Hop, Mesh};
use super::read::Section;
use super::tree::Value;

const MESH_KEYS: &[&str] = &["tls", "tls_resumption"];

/// Reads `[mesh]`: `tls` = `"off"` (the default, also `false`) | `"tls"`
/// (also `true`) | `"mtls"`; `tls_resumption` = `true` (the default) |
/// `false`.
pub(super) fn mesh(s: &Section<'_>, p: &mut Problems) -> Option<Mesh> {
    s.unknown_keys(p, MESH_KEYS);
    let tls = match s.get("tls") {
        None => Some(TlsMode::Off),
        Some(entry) => match entry.node.value {
            Value::Boolean(true) => Some(TlsMode::Tls),
            Value::Boolean(false) => Some(TlsMode::Off),
            Value::String(_) => s.choice(
                p,
                "tls",
                &[
                    ("off", TlsMode::Off),
                    ("tls", TlsMode::Tls),
                    ("mtls", TlsMode::Mtls),
                ],
            ),
            _ => {
                s.wrong_type(p, entry, "\"off\", \"tls\", \"mtls\" or a boolean");
                None
            }
        },
    };
    let tls_resumption = match s.get("tls_resumption") {
        None => Some(true),
        Some(_) => s.boolean(p, "tls_resumption"),
    };
    Some(Mesh {
        tls: tls?,
        tls_resumption: tls_resumption?,
    })
}

/// Reports TLS that the rest of the variant cannot provide: another broker
/// than tailmesh's, whose clients here speak plaintext to it.
pub(super) fn check_support(
    s: &Section<'_>,
    p: &mut Problems,
    mesh: &Mesh,
    broker: BrokerKind,
    hops: &[Hop],
) {
    if !mesh.tls.is_on() {
        return;
    }
    let Some(entry) = s.get("tls") else {
        return;
    };
    let span = &entry.node.span;
    if broker != BrokerKind::Tailmesh && hops.iter().any(|h| h.transport == Transport::Pull) {
        s.report(
            p,
            span,
            format!(
                "mesh.tls = \"{}\" cannot go with broker.kind = \"{}\": tailmesh speaks \
                 plaintext to RabbitMQ and NATS; tailmesh's own broker (broker.kind = \
                 \"tailmesh\") supports TLS",
                mesh.tls.as_str(),
                broker.as_str()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use tailmesh_services::tls::TlsMode;

    use crate::scenario::{model::Mesh, parse};

    const BASE: &str = r#"
name = "m"
[load]
mode = "closed"
concurrency = 1
requests = 10
[[hop]]
name = "a"
[[hop]]
name = "b"
"#;

    fn meshes(text: &str) -> Vec<(String, Mesh)> {
        let scenario = parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        scenario
            .variants
            .into_iter()
            .map(|v| (v.name, v.mesh))
            .collect()
    }

    fn problems(text: &str) -> String {
        match parse(text, "t.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    fn mesh(tls: TlsMode, tls_resumption: bool) -> Mesh {
        Mesh {
            tls,
            tls_resumption,
        }
    }

    #[test]
    fn tls_is_off_unless_the_file_or_a_variant_turns_it_on() {
        assert_eq!(meshes(BASE), [("base".to_owned(), Mesh::default())]);
        assert_eq!(Mesh::default(), mesh(TlsMode::Off, true));
        for (value, mode) in [
            ("\"off\"", TlsMode::Off),
            ("false", TlsMode::Off),
            ("\"tls\"", TlsMode::Tls),
            ("true", TlsMode::Tls),
            ("\"mtls\"", TlsMode::Mtls),
        ] {
            let file = format!("{BASE}[mesh]\ntls = {value}\ntls_resumption = false\n");
            assert_eq!(meshes(&file)[0].1, mesh(mode, false), "{value}");
        }
        let variants = format!(
            "{BASE}[mesh]\ntls = \"tls\"\n[[variant]]\nname = \"file\"\n[[variant]]\nname = \"m\"\nset = {{ \"mesh.tls\" = \"mtls\", \"mesh.tls_resumption\" = false }}\n[[variant]]\nname = \"off\"\nunset = [\"mesh.tls\"]\n"
        );
        assert_eq!(
            meshes(&variants),
            [
                ("file".to_owned(), mesh(TlsMode::Tls, true)),
                ("m".to_owned(), mesh(TlsMode::Mtls, false)),
                ("off".to_owned(), mesh(TlsMode::Off, true)),
            ]
        );
    }

    #[test]
    fn a_bad_mode_key_or_type_is_reported_where_it_is_written() {
        let mode = problems(&format!("{BASE}[mesh]\ntls = \"ssl\"\n"));
        assert!(
            mode.contains("t.toml:12:7") && mode.contains("\"ssl\"") && mode.contains("\"mtls\""),
            "{mode}"
        );
        let typed = problems(&format!("{BASE}[mesh]\ntls = 1\n"));
        assert!(typed.contains("t.toml:12:7"), "{typed}");
        let resumption = problems(&format!("{BASE}[mesh]\ntls_resumption = \"yes\"\n"));
        assert!(
            resumption.contains("t.toml:12:18") && resumption.contains("boolean"),
            "{resumption}"
        );
        let key = problems(&format!("{BASE}[mesh]\nalpn = \"h2\"\n"));
        assert!(key.contains("t.toml:12:1") && key.contains("alpn"), "{key}");
        let path = problems(&format!(
            "{BASE}[[variant]]\nname = \"v\"\nset = {{ \"mesh\" = \"tls\" }}\n"
        ));
        assert!(path.contains("must name a key of [mesh]"), "{path}");
        let value = problems(&format!(
            "{BASE}[[variant]]\nname = \"v\"\nset = {{ \"mesh.tls\" = \"ssl\" }}\n"
        ));
        assert!(
            value.contains("variant \"v\"") && value.contains("ssl"),
            "{value}"
        );
    }

    #[test]
    fn tls_with_another_broker_is_refused_at_the_key_and_the_netns_launcher_takes_it() {
        let pulled = BASE.replace("name = \"b\"", "name = \"b\"\ntransport = \"pull\"");
        for kind in ["rabbitmq", "nats"] {
            let problem = problems(&format!(
                "{pulled}[broker]\nkind = \"{kind}\"\n[mesh]\ntls = \"mtls\"\n"
            ));
            assert!(
                problem.contains("t.toml:15:7")
                    && problem.contains("mesh.tls")
                    && problem.contains(kind)
                    && problem.contains("tailmesh's own broker"),
                "{problem}"
            );
        }
        // tailmesh's broker, or another one with nothing pulled, is fine.
        let own = format!("{pulled}[mesh]\ntls = \"mtls\"\n");
        assert_eq!(meshes(&own)[0].1.tls, TlsMode::Mtls);
        let unused = format!("{BASE}[broker]\nkind = \"nats\"\n[mesh]\ntls = true\n");
        assert_eq!(meshes(&unused)[0].1.tls, TlsMode::Tls);

        // The netns launcher issues each certificate once the namespace,
        // and so the address it names, exists.
        let netns = format!("launcher = \"netns\"\n{BASE}[mesh]\ntls = \"mtls\"\n");
        assert_eq!(meshes(&netns)[0].1.tls, TlsMode::Mtls);
        let faulty = BASE.replace("name = \"b\"", "name = \"b\"\nnet = { loss = 0.01 }");
        assert_eq!(
            meshes(&format!("{faulty}[mesh]\ntls = true\n"))[0].1.tls,
            TlsMode::Tls
        );
    }
}

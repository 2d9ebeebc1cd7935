//! TLS in a deployment (`[mesh] tls`): a CA per deployment and, per
//! service of a TLS variant and for the orchestrator, a certificate naming
//! every DNS name the service is reached by (and `localhost`, `127.0.0.1`
//! for its own health check). Every container finds its material in
//! [`TLS_DIR`] as `ca.crt`, `tls.crt` and `tls.key`, which is what
//! `--tls-dir` reads ([`files_in`]).
//!
//! Compose gets the files in a folder beside the Compose file
//! ([`compose_folder`]: one subfolder per service, mounted read-only);
//! Kubernetes gets them in a Secret ([`issue`]). The CA's private key is
//! never written: a folder whose services changed is refused, not patched.
//! The CA certificate's SHA-256 is stamped on the services and handed to
//! each container in [`CA_SHA256_ENV`], so a container that finds another
//! CA in its folder says so and stops.

use std::path::{Path, PathBuf};

use tailmesh_services::tls::{Authority, Issued, TlsError, TlsFiles};

use super::Service;

/// Where every container finds its TLS material.
pub const TLS_DIR: &str = "/etc/tailmesh/tls";
/// The CA certificate in a TLS folder.
pub const CA_FILE: &str = "ca.crt";
/// The service's certificate in a TLS folder.
pub const CERT_FILE: &str = "tls.crt";
/// Its private key.
pub const KEY_FILE: &str = "tls.key";
/// The environment variable holding the SHA-256 (hex) of the CA
/// certificate the deployment was generated with.
pub const CA_SHA256_ENV: &str = "TAILMESH_TLS_CA_SHA256";
/// The orchestrator's identity (its folder, its certificate's name).
pub const ORCHESTRATOR: &str = "orchestrator";

/// Why a TLS folder could not be made, reused or read.
#[derive(Debug, thiserror::Error)]
pub enum TlsDirError {
    /// Making, reading or parsing the certificates failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A file or folder could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// An existing folder does not hold exactly this deployment's
    /// certificates from one CA.
    #[error(
        "{}: {why}; it holds the certificates of another deployment or of an older version \
         of this scenario, and its CA's key is not kept to issue new ones: remove the folder \
         (rm -r {}) and generate again",
        dir.display(),
        dir.display()
    )]
    Stale { dir: PathBuf, why: String },
    /// The folder's CA is not the one the deployment was generated with.
    #[error(
        "{}: its CA certificate has SHA-256 {found}, but this deployment was generated with \
         {expected} ({CA_SHA256_ENV}): the certificates were made again after the deployment \
         file; generate the deployment file again",
        path.display()
    )]
    OtherCa {
        path: PathBuf,
        expected: String,
        found: String,
    },
}

/// One identity to issue: the folder or Secret key it goes in, and the
/// names its certificate carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The service's name (or [`ORCHESTRATOR`]).
    pub name: String,
    /// DNS names and IP addresses it is reached by.
    pub names: Vec<String>,
}

/// The identities of a deployment: every tailmesh service of a variant
/// with TLS on, with `dns(name)` (its DNS names) and `localhost` and
/// `127.0.0.1`, and the orchestrator; empty when no variant uses TLS.
pub fn identities(services: &[Service], dns: impl Fn(&str) -> Vec<String>) -> Vec<Identity> {
    let with_local = |name: &str| {
        let mut names = dns(name);
        names.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
        Identity {
            name: name.to_owned(),
            names,
        }
    };
    let mut out: Vec<Identity> = services
        .iter()
        .filter(|s| s.tls.is_on() && s.broker_image().is_none())
        .map(|s| with_local(&s.name))
        .collect();
    if !out.is_empty() {
        out.push(with_local(ORCHESTRATOR));
    }
    out
}

/// A deployment's CA and the certificates it issued.
#[derive(Debug)]
pub struct Material {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// Its SHA-256, hex.
    pub ca_sha256: String,
    /// Each identity's certificate and key, in the order given.
    pub issued: Vec<(String, Issued)>,
}

/// A new CA named after `deployment` and a certificate for each identity.
pub fn issue(deployment: &str, identities: &[Identity]) -> Result<Material, TlsError> {
    let ca = Authority::new(&format!("tailmesh deployment CA ({deployment})"))?;
    let issued = identities
        .iter()
        .map(|id| Ok((id.name.clone(), ca.issue(&id.name, &id.names)?)))
        .collect::<Result<Vec<_>, TlsError>>()?;
    let ca_pem = ca.cert_pem();
    Ok(Material {
        ca_sha256: super::digest(&ca_pem),
        ca_pem,
        issued,
    })
}

/// Makes `dir` with one subfolder per identity holding `ca.crt`,
/// `tls.crt` and `tls.key` (mode 0600), or reuses it when it already holds
/// exactly these identities' files from one CA; anything else is refused
/// ([`TlsDirError::Stale`]), never mixed. Returns the CA's SHA-256 and
/// whether the folder was reused.
pub fn compose_folder(
    dir: &Path,
    deployment: &str,
    identities: &[Identity],
) -> Result<(String, bool), TlsDirError> {
    if dir.exists() {
        return reuse(dir, identities).map(|digest| (digest, true));
    }
    let material = issue(deployment, identities)?;
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsDirError::Io { what, path, source }
    };
    for (name, issued) in &material.issued {
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).map_err(io("create", &sub))?;
        write(&sub.join(CA_FILE), material.ca_pem.as_bytes(), 0o644)?;
        write(&sub.join(CERT_FILE), issued.cert_pem.as_bytes(), 0o644)?;
        write(&sub.join(KEY_FILE), issued.key_pem.as_bytes(), 0o600)?;
    }
    Ok((material.ca_sha256, false))
}

/// The CA digest of an existing folder that holds exactly `identities`,
/// each with the same CA and its certificate and key.
fn reuse(dir: &Path, identities: &[Identity]) -> Result<String, TlsDirError> {
    let stale = |why: String| TlsDirError::Stale {
        dir: dir.to_path_buf(),
        why,
    };
    let entries = std::fs::read_dir(dir).map_err(|source| TlsDirError::Io {
        what: "read",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut present: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut wanted: Vec<String> = identities.iter().map(|i| i.name.clone()).collect();
    wanted.sort();
    if present != wanted {
        return Err(stale(format!(
            "it has {} where this deployment has {}",
            list(&present),
            list(&wanted)
        )));
    }
    let mut digest: Option<String> = None;
    for name in &wanted {
        let sub = dir.join(name);
        for file in [CERT_FILE, KEY_FILE] {
            if !sub.join(file).is_file() {
                return Err(stale(format!("{name}/{file} is missing")));
            }
        }
        let ca = std::fs::read_to_string(sub.join(CA_FILE))
            .map_err(|e| stale(format!("{name}/{CA_FILE}: {e}")))?;
        let this = super::digest(&ca);
        match &digest {
            Some(first) if *first != this => {
                return Err(stale(format!(
                    "{name}/{CA_FILE} is another CA than the other services'"
                )));
            }
            _ => digest = Some(this),
        }
    }
    digest.ok_or_else(|| stale("it is empty".to_owned()))
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "nothing".to_owned()
    } else {
        names.join(", ")
    }
}

/// Writes `contents` to a new file `path` created with `mode`
/// ([`tailmesh_services::tls::write_new`]).
fn write(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsDirError> {
    tailmesh_services::tls::write_new(path, contents, mode).map_err(|source| TlsDirError::Io {
        what: "write",
        path: path.to_path_buf(),
        source,
    })
}

/// The TLS material in `dir` (`ca.crt`, `tls.crt`, `tls.key`) as a
/// process's files; when [`CA_SHA256_ENV`] is set, the CA must be the one
/// it names.
pub fn files_in(dir: &Path, mutual: bool, resumption: bool) -> Result<TlsFiles, TlsDirError> {
    let expected = std::env::var_os(CA_SHA256_ENV).map(|e| e.to_string_lossy().trim().to_owned());
    files_of_ca(dir, mutual, resumption, expected)
}

/// [`files_in`], the CA checked against `expected` when given.
fn files_of_ca(
    dir: &Path,
    mutual: bool,
    resumption: bool,
    expected: Option<String>,
) -> Result<TlsFiles, TlsDirError> {
    let files = TlsFiles {
        ca: dir.join(CA_FILE),
        cert: dir.join(CERT_FILE),
        key: dir.join(KEY_FILE),
        mutual,
        resumption,
    };
    if let Some(expected) = expected {
        let ca = std::fs::read_to_string(&files.ca).map_err(|source| TlsDirError::Io {
            what: "read",
            path: files.ca.clone(),
            source,
        })?;
        let found = super::digest(&ca);
        if found != expected {
            return Err(TlsDirError::OtherCa {
                path: files.ca,
                expected,
                found,
            });
        }
    }
    Ok(files)
}

/// The client config of a process holding the material in `dir`: it
/// trusts the CA there and presents its certificate to a server that asks
/// for one (mtls).
pub fn client_in(
    dir: &Path,
    resumption: bool,
) -> Result<std::sync::Arc<rustls::ClientConfig>, TlsDirError> {
    Ok(files_in(dir, true, resumption)?.load()?.client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<Identity> {
        names
            .iter()
            .map(|n| Identity {
                name: (*n).to_owned(),
                names: vec![(*n).to_owned(), "localhost".to_owned()],
            })
            .collect()
    }

    /// A scenario with a plaintext and an mTLS variant, the second's
    /// last hop pulled.
    const MIXED: &str = "name = \"m\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 10\n\
        [[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\ntransport = \"pull\"\n\
        [[variant]]\nname = \"plain\"\n[[variant]]\nname = \"sec\"\n\
        set = { \"mesh.tls\" = \"mtls\" }\n";

    #[test]
    fn only_the_tls_variants_services_and_the_orchestrator_get_certificates() {
        let scenario = crate::scenario::parse(MIXED, "m.toml").unwrap_or_else(|e| panic!("{e}"));
        let runtime = super::super::Runtime {
            name: "Docker Compose",
            net_admin: true,
            pod: false,
        };
        let services = super::super::services(&scenario, runtime).expect("deployable");
        let identities = identities(&services, |n| vec![format!("{n}.svc")]);
        let names: Vec<&str> = identities.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            ["sec-broker", "sec-hop-b-0", "sec-hop-a-0", ORCHESTRATOR]
        );
        assert_eq!(
            identities[1].names,
            ["sec-hop-b-0.svc", "localhost", "127.0.0.1"]
        );
        // The TLS broker reads the same folder through its own flags.
        let broker = services
            .iter()
            .find(|s| s.name == "sec-broker")
            .expect("the broker");
        let command = broker.command().join(" ");
        assert!(
            command.contains("--tls-ca /etc/tailmesh/tls/ca.crt --tls-cert /etc/tailmesh/tls/tls.crt --tls-key /etc/tailmesh/tls/tls.key --tls-mutual"),
            "{command}"
        );
        let plain = services
            .iter()
            .find(|s| s.name == "plain-hop-a-0")
            .expect("a plaintext hop");
        assert!(!plain.command().iter().any(|a| a == "--tls-dir"));
        assert!(!plain.health_command().iter().any(|a| a == "--tls-dir"));

        // Compose: a folder per TLS service, none for the plaintext ones.
        let options = super::super::compose::Options {
            tls: Some(super::super::compose::TlsFolder {
                path: "./tailmesh-m-tls".to_owned(),
                ca_sha256: "ab".repeat(32),
            }),
            ..Default::default()
        };
        let file = super::super::compose::generate(&scenario, MIXED, &options).expect("a file");
        assert_eq!(file.matches(":/etc/tailmesh/tls:ro").count(), 4, "{file}");
        assert!(!file.contains("./tailmesh-m-tls/plain-"), "{file}");
        assert!(file.contains("./tailmesh-m-tls/orchestrator:/etc/tailmesh/tls:ro"));
    }

    #[test]
    fn a_folder_is_made_reused_as_it_is_and_refused_when_it_differs() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let dir = scratch.path().join("tailmesh-s-tls");
        let both = ids(&["hop-a-0", ORCHESTRATOR]);
        let (digest, reused) = compose_folder(&dir, "s", &both).expect("made");
        assert!(!reused);
        let ca = std::fs::read_to_string(dir.join("hop-a-0").join(CA_FILE)).expect("ca.crt");
        assert_eq!(super::super::digest(&ca), digest);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("hop-a-0").join(KEY_FILE))
                .expect("a key")
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // Loads as a process's material, the CA checked when named.
        let files =
            files_of_ca(&dir.join("hop-a-0"), true, true, Some(digest.clone())).expect("files");
        assert!(files.load().expect("load").mutual);
        let error = files_of_ca(&dir.join("hop-a-0"), true, true, Some("00".repeat(32)))
            .expect_err("another CA's digest")
            .to_string();
        assert!(
            error.contains(&digest) && error.contains(CA_SHA256_ENV),
            "{error}"
        );

        // The same services again: the same CA.
        assert_eq!(
            compose_folder(&dir, "s", &both).expect("reused"),
            (digest.clone(), true)
        );
        // Another set of services: refused, naming both.
        let more = ids(&["hop-a-0", "hop-b-0", ORCHESTRATOR]);
        let error = compose_folder(&dir, "s", &more)
            .expect_err("another deployment")
            .to_string();
        assert!(
            error.contains("hop-b-0") && error.contains("rm -r"),
            "{error}"
        );
        // One service's CA replaced by another: refused, never mixed.
        let other = Authority::new("another").expect("a CA");
        std::fs::remove_file(dir.join(ORCHESTRATOR).join(CA_FILE)).expect("remove");
        std::fs::write(dir.join(ORCHESTRATOR).join(CA_FILE), other.cert_pem()).expect("write");
        let error = compose_folder(&dir, "s", &both)
            .expect_err("two CAs")
            .to_string();
        assert!(error.contains("another CA"), "{error}");
    }
}

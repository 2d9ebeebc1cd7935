//! TLS in a deployment (`[mesh] tls`): a CA per deployment and, per
//! service of a TLS variant and for the orchestrator, a certificate naming
//! every DNS name the service is reached by (and `localhost`, `127.0.0.1`
//! for its own health check). Every container finds its material in
//! [`TLS_DIR`] as `ca.crt`, `tls.crt` and `tls.key`, which is what
//! `--tls-dir` reads ([`files_in`]).
//!
//! A CA folder ([`ca_folder`]) keeps the CA across generations: `ca.crt`
//! and `ca.key` (mode 0600, written once) at its top, and one subfolder
//! per identity with `ca.crt`, `tls.crt` and `tls.key` (mode 0600). A
//! later generation signs with the same CA and keeps every certificate
//! that still names what its identity needs, so an unchanged service gets
//! byte-identical material; only new or changed identities are issued.
//!
//! Compose's folder beside the Compose file is such a folder
//! ([`compose_folder`]; each service's subfolder is mounted read-only, the
//! top never is); Kubernetes gets the material in a Secret, from a CA
//! folder given with `--ca-dir` or from a CA made for that generation
//! ([`issue`]). The CA's private key is never in a deployment file.
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
/// The CA's private key at the top of a CA folder (mode 0600). Identity
/// subfolders are named after services (DNS labels, no dot), so they never
/// meet this name or [`CA_FILE`].
pub const CA_KEY_FILE: &str = "ca.key";
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
    /// A folder made without its CA's key does not hold exactly this
    /// deployment's certificates from one CA.
    #[error(
        "{}: {why}; the folder was made without keeping its CA's key (by an older tailmesh), \
         so no certificate can be added to it: remove the folder (rm -r {}) and generate \
         again, which keeps the new CA's key in it",
        dir.display(),
        dir.display()
    )]
    Stale { dir: PathBuf, why: String },
    /// A CA folder whose CA cannot be used as it is.
    #[error("{}: {why}", dir.display())]
    CaFolder { dir: PathBuf, why: String },
    /// The CA key in a CA folder can be read by others.
    #[error(
        "{}: mode {mode:o} lets others read the CA's private key: chmod 600 {}, and issue a new \
         CA (remove the folder) if anyone else may have read it",
        path.display(),
        path.display()
    )]
    KeyMode { path: PathBuf, mode: u32 },
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

/// What a CA folder held and what was made in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FolderReport {
    /// The CA certificate's SHA-256, hex.
    pub ca_sha256: String,
    /// Whether the CA was read from the folder (else made and written now).
    pub ca_kept: bool,
    /// The identities whose certificates and keys were kept as they were.
    pub kept: Vec<String>,
    /// The identities issued a certificate now, with why one there could
    /// not be kept.
    pub issued: Vec<(String, Option<String>)>,
}

impl std::fmt::Display for FolderReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CA sha256 {} ({})",
            self.ca_sha256,
            if self.ca_kept { "kept" } else { "new" }
        )?;
        if !self.kept.is_empty() {
            write!(f, "; {} certificate(s) kept", self.kept.len())?;
        }
        if !self.issued.is_empty() {
            let issued: Vec<String> = self
                .issued
                .iter()
                .map(|(name, why)| match why {
                    None => name.clone(),
                    Some(why) => format!("{name}: {why}"),
                })
                .collect();
            write!(f, "; issued: {}", issued.join(", "))?;
        }
        Ok(())
    }
}

/// The CA folder `dir` (see the module docs) for `identities`: its CA,
/// read from `ca.crt` and `ca.key`, or, when `dir` is missing or empty, a
/// new CA named after `deployment` written there (the key once, mode 0600);
/// each identity's certificate and key kept where they are this CA's for
/// exactly its names ([`Authority::mismatch`]), issued and written
/// otherwise. Subfolders of identities not asked for are left alone.
/// Returns the material in the order of `identities`, the CA's key not
/// among it, and what was kept and made.
pub fn ca_folder(
    dir: &Path,
    deployment: &str,
    identities: &[Identity],
) -> Result<(Material, FolderReport), TlsDirError> {
    let (ca, ca_kept) = authority(dir, deployment)?;
    let ca_pem = ca.cert_pem();
    let mut report = FolderReport {
        ca_sha256: super::digest(&ca_pem),
        ca_kept,
        kept: Vec::new(),
        issued: Vec::new(),
    };
    let mut issued = Vec::with_capacity(identities.len());
    for id in identities {
        let sub = dir.join(&id.name);
        // Why the certificate there cannot be kept (None: there is none).
        let mut why = None;
        let found = existing(&sub)?.filter(|found| {
            why = ca.mismatch(found, &id.name, &id.names);
            why.is_none()
        });
        let material = match found {
            Some(found) => {
                report.kept.push(id.name.clone());
                found
            }
            None => {
                let made = ca.issue(&id.name, &id.names)?;
                create_dir(&sub)?;
                replace(&sub.join(CERT_FILE), made.cert_pem.as_bytes(), 0o644)?;
                replace(&sub.join(KEY_FILE), made.key_pem.as_bytes(), 0o600)?;
                let why = why.map(|why| format!("replaced, {why}"));
                report.issued.push((id.name.clone(), why));
                made
            }
        };
        // The subfolder's copy of the CA, as a container reads it.
        let copy = sub.join(CA_FILE);
        if std::fs::read_to_string(&copy).ok().as_deref() != Some(ca_pem.as_str()) {
            replace(&copy, ca_pem.as_bytes(), 0o644)?;
        }
        issued.push((id.name.clone(), material));
    }
    let material = Material {
        ca_sha256: report.ca_sha256.clone(),
        ca_pem,
        issued,
    };
    Ok((material, report))
}

/// The CA of the folder `dir` and whether it was there: read back, or
/// made and written when the folder is missing or empty.
fn authority(dir: &Path, deployment: &str) -> Result<(Authority, bool), TlsDirError> {
    let folder = |why: String| TlsDirError::CaFolder {
        dir: dir.to_path_buf(),
        why,
    };
    let cert = dir.join(CA_FILE);
    let key = dir.join(CA_KEY_FILE);
    match (cert.exists(), key.exists()) {
        (true, true) => {
            let mode =
                std::os::unix::fs::PermissionsExt::mode(&metadata(&key)?.permissions()) & 0o777;
            if mode & 0o077 != 0 {
                return Err(TlsDirError::KeyMode { path: key, mode });
            }
            let ca = Authority::from_pem(&read(&cert)?, &read(&key)?)
                .map_err(|e| folder(format!("{CA_FILE} and {CA_KEY_FILE}: {e}")))?;
            Ok((ca, true))
        }
        (true, false) | (false, true) => {
            let (has, lacks) = if cert.exists() {
                (CA_FILE, CA_KEY_FILE)
            } else {
                (CA_KEY_FILE, CA_FILE)
            };
            Err(folder(format!(
                "it holds {has} but no {lacks}, so its CA cannot sign: put the CA's {lacks} back, \
                 or remove the folder (rm -r {}) to make a new CA",
                dir.display()
            )))
        }
        (false, false) => {
            if dir.exists() && !is_empty(dir)? {
                return Err(folder(format!(
                    "it holds other files but no CA ({CA_FILE}, {CA_KEY_FILE}): give a new or \
                     empty folder"
                )));
            }
            create_dir(dir)?;
            let ca = Authority::new(&format!("tailmesh deployment CA ({deployment})"))?;
            // Cut short between the two, the folder holds half a CA and is
            // refused as such, never taken for an empty one.
            write(&key, ca.key_pem().as_bytes(), 0o600)?;
            write(&cert, ca.cert_pem().as_bytes(), 0o644)?;
            Ok((ca, false))
        }
    }
}

/// The certificate and key in an identity's subfolder, if both are there.
fn existing(sub: &Path) -> Result<Option<Issued>, TlsDirError> {
    let (cert, key) = (sub.join(CERT_FILE), sub.join(KEY_FILE));
    if !cert.is_file() || !key.is_file() {
        return Ok(None);
    }
    Ok(Some(Issued {
        cert_pem: read(&cert)?,
        key_pem: read(&key)?,
    }))
}

/// Makes `dir` with one subfolder per identity holding `ca.crt`,
/// `tls.crt` and `tls.key` (mode 0600), and the CA's `ca.crt` and `ca.key`
/// at its top, or reuses it: a CA folder ([`ca_folder`]), so a service
/// added later gets a certificate from the same CA and the others keep
/// theirs. A folder made by an older tailmesh, without the CA's key, is
/// reused only when it holds exactly these identities' files from one CA,
/// and refused otherwise ([`TlsDirError::Stale`]).
pub fn compose_folder(
    dir: &Path,
    deployment: &str,
    identities: &[Identity],
) -> Result<FolderReport, TlsDirError> {
    let top_ca = dir.join(CA_FILE).exists() || dir.join(CA_KEY_FILE).exists();
    if dir.exists() && !top_ca && !is_empty(dir)? {
        let ca_sha256 = reuse(dir, identities)?;
        return Ok(FolderReport {
            ca_sha256,
            ca_kept: true,
            kept: identities.iter().map(|i| i.name.clone()).collect(),
            issued: Vec::new(),
        });
    }
    ca_folder(dir, deployment, identities).map(|(_, report)| report)
}

/// The CA digest of a folder without its CA's key that holds exactly
/// `identities`, each with the same CA and its certificate and key.
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
    tailmesh_services::tls::write_new(path, contents, mode).map_err(io("write", path))
}

/// Writes `contents` to `path` created with `mode`, replacing a file
/// there only once the new one is whole (written beside it, renamed).
fn replace(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsDirError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".new");
    let fresh = path.with_file_name(name);
    match std::fs::remove_file(&fresh) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("remove", &fresh)(e));
        }
        _ => {}
    }
    write(&fresh, contents, mode)?;
    std::fs::rename(&fresh, path).map_err(io("replace", path))
}

fn read(path: &Path) -> Result<String, TlsDirError> {
    std::fs::read_to_string(path).map_err(io("read", path))
}

fn metadata(path: &Path) -> Result<std::fs::Metadata, TlsDirError> {
    std::fs::metadata(path).map_err(io("read", path))
}

fn create_dir(dir: &Path) -> Result<(), TlsDirError> {
    std::fs::create_dir_all(dir).map_err(io("create", dir))
}

fn is_empty(dir: &Path) -> Result<bool, TlsDirError> {
    let mut entries = std::fs::read_dir(dir).map_err(io("read", dir))?;
    Ok(entries.next().is_none())
}

/// The error of an I/O step on `path`.
fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TlsDirError {
    let path = path.to_path_buf();
    move |source| TlsDirError::Io { what, path, source }
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

    fn mode(path: &Path) -> u32 {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .permissions(),
        ) & 0o777
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn a_ca_folder_signs_every_generation_and_keeps_unchanged_certificates() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let dir = scratch.path().join("ca");
        let mut both = ids(&["hop-a-0", ORCHESTRATOR]);
        let (first, report) = ca_folder(&dir, "s", &both).expect("made");
        assert!(!report.ca_kept);
        assert!(report.kept.is_empty());
        assert_eq!(report.issued.len(), 2);
        assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.join("hop-a-0").join(KEY_FILE)), 0o600);
        assert_eq!(read(&dir.join(CA_FILE)), first.ca_pem);
        assert_eq!(report.ca_sha256, super::super::digest(&first.ca_pem));
        let ca_key = read(&dir.join(CA_KEY_FILE));
        assert!(ca_key.contains("PRIVATE KEY"), "{ca_key}");
        // The material handed on carries no trace of the CA's key.
        for (_, issued) in &first.issued {
            assert!(!issued.key_pem.contains(ca_key.trim()));
        }

        // Again: the same CA, the same certificates and keys, to the byte.
        let (second, report) = ca_folder(&dir, "s", &both).expect("reused");
        assert!(report.ca_kept && report.issued.is_empty(), "{report}");
        assert_eq!(report.kept, ["hop-a-0", ORCHESTRATOR]);
        assert_eq!(second.ca_pem, first.ca_pem);
        for ((a, x), (b, y)) in first.issued.iter().zip(&second.issued) {
            assert_eq!((a, &x.cert_pem, &x.key_pem), (b, &y.cert_pem, &y.key_pem));
        }
        assert_eq!(read(&dir.join(CA_KEY_FILE)), ca_key, "written once");

        // One identity reached by another name: only its certificate is
        // issued again, by the same CA; the other is kept.
        both[0].names.push("hop-a-0.elsewhere".to_owned());
        let (third, report) = ca_folder(&dir, "s", &both).expect("updated");
        assert_eq!(report.kept, [ORCHESTRATOR]);
        let (name, why) = &report.issued[0];
        assert_eq!(name, "hop-a-0");
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("hop-a-0.elsewhere")),
            "{report}"
        );
        assert_ne!(third.issued[0].1.cert_pem, first.issued[0].1.cert_pem);
        assert_eq!(third.issued[1].1.key_pem, first.issued[1].1.key_pem);
        let files = files_of_ca(&dir.join("hop-a-0"), true, true, Some(report.ca_sha256))
            .expect("the CA checked");
        assert!(files.load().expect("loads").mutual);
    }

    #[test]
    fn a_ca_folder_that_cannot_sign_as_it_is_is_refused_saying_why() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let one = ids(&["hop-a-0"]);
        let refused = |dir: &Path| ca_folder(dir, "s", &one).expect_err("refused").to_string();

        // A folder holding something else is not made a CA folder.
        let busy = scratch.path().join("busy");
        std::fs::create_dir(&busy).expect("a folder");
        std::fs::write(busy.join("notes.txt"), "mine").expect("a file");
        assert!(refused(&busy).contains("no CA"));
        // An empty one is.
        let empty = scratch.path().join("empty");
        std::fs::create_dir(&empty).expect("a folder");
        ca_folder(&empty, "s", &one).expect("an empty folder is made a CA folder");

        let dir = scratch.path().join("ca");
        ca_folder(&dir, "s", &one).expect("made");
        let key = dir.join(CA_KEY_FILE);
        let perms = |mode| std::os::unix::fs::PermissionsExt::from_mode(mode);
        std::fs::set_permissions(&key, perms(0o644)).expect("chmod");
        let error = refused(&dir);
        assert!(
            error.contains("chmod 600") && error.contains("644"),
            "{error}"
        );
        std::fs::set_permissions(&key, perms(0o600)).expect("chmod");

        // Another CA's key beside the certificate.
        let kept = read(&key);
        std::fs::remove_file(&key).expect("remove");
        let other = Authority::new("another").expect("a CA");
        write(&key, other.key_pem().as_bytes(), 0o600).expect("another key");
        let error = refused(&dir);
        assert!(error.contains("not the certificate's"), "{error}");
        // No key at all.
        std::fs::remove_file(&key).expect("remove");
        let error = refused(&dir);
        assert!(error.contains("no ca.key"), "{error}");
        write(&key, kept.as_bytes(), 0o600).expect("the key back");
        ca_folder(&dir, "s", &one).expect("whole again");
    }

    #[test]
    fn a_compose_folder_keeps_its_ca_when_a_service_is_added() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let dir = scratch.path().join("tailmesh-s-tls");
        let both = ids(&["hop-a-0", ORCHESTRATOR]);
        let report = compose_folder(&dir, "s", &both).expect("made");
        assert!(!report.ca_kept);
        let digest = report.ca_sha256;
        let ca = read(&dir.join("hop-a-0").join(CA_FILE));
        assert_eq!(super::super::digest(&ca), digest);
        assert_eq!(mode(&dir.join("hop-a-0").join(KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
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

        // The same services again: nothing changes.
        let leaf = |name: &str| {
            (
                read(&dir.join(name).join(CERT_FILE)),
                read(&dir.join(name).join(KEY_FILE)),
            )
        };
        let a = leaf("hop-a-0");
        let report = compose_folder(&dir, "s", &both).expect("reused");
        assert!(report.ca_kept && report.issued.is_empty(), "{report}");
        assert_eq!(report.ca_sha256, digest);
        // A service added: the same CA signs its certificate, the others
        // keep theirs.
        let more = ids(&["hop-a-0", "hop-b-0", ORCHESTRATOR]);
        let report = compose_folder(&dir, "s", &more).expect("grown");
        assert_eq!(report.ca_sha256, digest);
        assert_eq!(report.kept, ["hop-a-0", ORCHESTRATOR]);
        assert_eq!(report.issued, [("hop-b-0".to_owned(), None)]);
        assert_eq!(leaf("hop-a-0"), a);
        let b = dir.join("hop-b-0");
        assert_eq!(read(&b.join(CA_FILE)), ca);
        assert_eq!(mode(&b.join(KEY_FILE)), 0o600);
        let files = files_of_ca(&b, true, true, Some(digest.clone())).expect("files");
        assert!(files.load().expect("load").mutual);
        // A subfolder's copy of the CA swapped for another: put back.
        let other = Authority::new("another").expect("a CA");
        std::fs::write(b.join(CA_FILE), other.cert_pem()).expect("write");
        compose_folder(&dir, "s", &more).expect("repaired");
        assert_eq!(read(&b.join(CA_FILE)), ca);
        // A service removed: its folder is left, the rest kept.
        let report = compose_folder(&dir, "s", &both).expect("shrunk");
        assert!(report.issued.is_empty() && b.exists(), "{report}");
    }

    #[test]
    fn a_folder_without_its_ca_key_is_reused_as_it_is_and_refused_when_it_differs() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let dir = scratch.path().join("tailmesh-s-tls");
        let both = ids(&["hop-a-0", ORCHESTRATOR]);
        let digest = compose_folder(&dir, "s", &both).expect("made").ca_sha256;
        // As an older tailmesh left it: no CA at the top.
        std::fs::remove_file(dir.join(CA_FILE)).expect("remove");
        std::fs::remove_file(dir.join(CA_KEY_FILE)).expect("remove");

        let report = compose_folder(&dir, "s", &both).expect("reused");
        assert_eq!((report.ca_sha256, report.ca_kept), (digest, true));
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

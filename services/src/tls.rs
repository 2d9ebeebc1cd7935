//! TLS on tailmesh's links (`[mesh] tls`): a run's certificate authority
//! and the certificates it issues ([`Authority`]), the files a process is
//! handed ([`TlsFiles`]), and the rustls configs built from them: a server
//! that may require a client certificate signed by the run's CA (mtls), and
//! a client that trusts that CA only and, for mtls, presents its own
//! certificate.
//!
//! A process's client side is one config for every link it opens
//! ([`install_client`], [`client`]): the same session cache then resumes a
//! session with any peer it has met before, as a production client with
//! one TLS context does. Servers take their config explicitly.

use std::{
    fmt, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use rustls::{
    ClientConfig, HandshakeKind, RootCertStore, ServerConfig,
    client::Resumption,
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
    server::WebPkiClientVerifier,
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

/// The ALPN protocol every tailmesh link speaks.
pub const ALPN_H2: &[u8] = b"h2";

pub use tailmesh_model::TlsMode;

/// One process's TLS material as paths of PEM files (its configuration
/// file carries these), and what to do with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsFiles {
    /// The run's CA certificate: the only root trusted.
    pub ca: PathBuf,
    /// This process's certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
    /// mtls: servers require a client certificate, clients present theirs.
    pub mutual: bool,
    /// Client-side session resumption; off, every connection is a full
    /// handshake.
    #[serde(default = "yes")]
    pub resumption: bool,
}

fn yes() -> bool {
    true
}

/// A process's rustls configs.
#[derive(Clone)]
pub struct Tls {
    /// For its listeners.
    pub server: Arc<ServerConfig>,
    /// For every connection it opens.
    pub client: Arc<ClientConfig>,
    /// Whether servers require, and clients present, certificates.
    pub mutual: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("mutual", &self.mutual)
            .finish_non_exhaustive()
    }
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("{}: {what}", path.display())]
    Pem { path: PathBuf, what: String },
    #[error("{what}: {source}")]
    Rustls {
        what: &'static str,
        source: rustls::Error,
    },
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("generate {what}: {source}")]
    Generate { what: String, source: rcgen::Error },
    /// A kept CA's certificate and key cannot sign.
    #[error("the CA: {0}")]
    Authority(String),
}

impl TlsFiles {
    /// Reads the files and builds the configs.
    pub fn load(&self) -> Result<Tls, TlsError> {
        let ca = read_certs(&self.ca)?;
        let chain = read_certs(&self.cert)?;
        let key = read_key(&self.key)?;
        let identity = self.mutual.then(|| (chain.clone(), key.clone_key()));
        Ok(Tls {
            server: server_config(&ca, chain, key, self.mutual)?,
            client: client_config(&ca, identity, self.resumption)?,
            mutual: self.mutual,
        })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no certificate in it".to_owned(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        what: e.to_string(),
    })
}

/// ring, the only provider tailmesh builds with, named rather than taken
/// from the process default.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn roots(ca: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots.add(cert.clone()).map_err(|source| TlsError::Rustls {
            what: "add the CA certificate",
            source,
        })?;
    }
    Ok(roots)
}

/// A server presenting `chain`; with `mutual`, it refuses a client without
/// a certificate signed by `ca`. Session tickets are stateless (ring's
/// ticketer), so any number of clients can resume.
pub fn server_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    mutual: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let rustls = |what| move |source| TlsError::Rustls { what, source };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(rustls("TLS versions"))?;
    let builder = if mutual {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                .build()?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(rustls("server certificate"))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.ticketer = ring::Ticketer::new().map_err(rustls("session ticketer"))?;
    Ok(Arc::new(config))
}

/// A client trusting `ca` only, presenting `identity` when given (mtls);
/// without `resumption` it keeps no sessions, so every connection is a full
/// handshake.
pub fn client_config(
    ca: &[CertificateDer<'static>],
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    resumption: bool,
) -> Result<Arc<ClientConfig>, TlsError> {
    let rustls = |what| move |source| TlsError::Rustls { what, source };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(rustls("TLS versions"))?
        .with_root_certificates(roots(ca)?);
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(rustls("client certificate"))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    if !resumption {
        config.resumption = Resumption::disabled();
    }
    Ok(Arc::new(config))
}

/// The client config every link of this process opens with; `None`:
/// plaintext.
static CLIENT: RwLock<Option<Arc<ClientConfig>>> = RwLock::new(None);

/// Sets the client config of every link this process opens from now on
/// (`None`: plaintext). A hop sets it once at start; the orchestrator's
/// load generator before each variant.
pub fn install_client(config: Option<Arc<ClientConfig>>) {
    *CLIENT.write().unwrap_or_else(|e| e.into_inner()) = config;
}

/// The client config links open with now.
pub fn client() -> Option<Arc<ClientConfig>> {
    CLIENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A TLS connection a client opened.
pub type ClientStream = tokio_rustls::client::TlsStream<TcpStream>;

/// TLS over `tcp` to `host` (a DNS name or an IP address, which the
/// server's certificate must name), and whether the handshake was full or
/// resumed.
pub async fn connect(
    tcp: TcpStream,
    config: Arc<ClientConfig>,
    host: &str,
) -> io::Result<(ClientStream, HandshakeKind)> {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let kind = stream
        .get_ref()
        .1
        .handshake_kind()
        .unwrap_or(HandshakeKind::Full);
    if stream.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "TLS: the server did not agree to HTTP/2 (ALPN h2)",
        ));
    }
    Ok((stream, kind))
}

/// A certificate authority: a run's (ECDSA P-256), made at launch and
/// never written anywhere but the run's directory, or a deployment's,
/// kept in its CA folder and read back ([`Authority::from_pem`]) so later
/// generations sign with the same CA.
pub struct Authority {
    /// The certificate's PEM text, as made or as read (its digest is the
    /// one a deployment names).
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// A certificate and its private key, in PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

fn generate(what: &str) -> impl FnOnce(rcgen::Error) -> TlsError {
    let what = what.to_owned();
    move |source| TlsError::Generate { what, source }
}

fn p256() -> Result<rcgen::KeyPair, rcgen::Error> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
}

impl Authority {
    /// A new CA named `name` (the common name).
    pub fn new(name: &str) -> Result<Self, TlsError> {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = p256().map_err(generate("the CA key"))?;
        let cert = params.self_signed(&key).map_err(generate("the CA"))?;
        Ok(Authority {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// The CA whose certificate is `cert_pem` and private key (PKCS#8)
    /// `key_pem`, as [`Authority::cert_pem`] and [`Authority::key_pem`]
    /// gave them: refused unless the certificate is a CA's and the key is
    /// its own.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| TlsError::Authority(format!("the certificate is not PEM: {e}")))?;
        let cert = pem
            .parse_x509()
            .map_err(|e| TlsError::Authority(format!("the certificate does not parse: {e}")))?;
        if !cert.is_ca() {
            return Err(TlsError::Authority(
                "the certificate is not a CA's (no basicConstraints CA:true)".to_owned(),
            ));
        }
        let key = rcgen::KeyPair::from_pem(key_pem)
            .map_err(|e| TlsError::Authority(format!("the private key does not parse: {e}")))?;
        if rcgen::PublicKeyData::subject_public_key_info(&key) != cert.public_key().raw {
            return Err(TlsError::Authority(
                "the private key is not the certificate's".to_owned(),
            ));
        }
        let cert_der = CertificateDer::from(pem.contents.clone());
        let issuer = rcgen::Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| TlsError::Authority(format!("the certificate cannot issue: {e}")))?;
        Ok(Authority {
            cert_pem: cert_pem.to_owned(),
            cert_der,
            issuer,
        })
    }

    /// The CA certificate in PEM.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA certificate.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }

    /// The CA's private key in PEM (PKCS#8): whoever holds it can issue
    /// certificates every service of the deployment trusts, so it is only
    /// ever written to a file of mode 0600.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Why `issued` cannot be kept as this CA's certificate for
    /// `common_name` and exactly `names` (as [`Authority::issue`] would
    /// make it), or `None` when it can: it must parse, be signed by this
    /// CA, be valid now, name exactly these, and come with its own key.
    pub fn mismatch(&self, issued: &Issued, common_name: &str, names: &[String]) -> Option<String> {
        let (_, pem) = match x509_parser::pem::parse_x509_pem(issued.cert_pem.as_bytes()) {
            Ok(parsed) => parsed,
            Err(e) => return Some(format!("its certificate is not PEM: {e}")),
        };
        let cert = match pem.parse_x509() {
            Ok(cert) => cert,
            Err(e) => return Some(format!("its certificate does not parse: {e}")),
        };
        let ca = match x509_parser::parse_x509_certificate(&self.cert_der) {
            Ok((_, ca)) => ca,
            Err(e) => return Some(format!("the CA's certificate does not parse: {e}")),
        };
        if cert.issuer().as_raw() != ca.subject().as_raw()
            || cert.verify_signature(Some(ca.public_key())).is_err()
        {
            return Some("it was issued by another CA".to_owned());
        }
        if !cert.validity().is_valid() {
            return Some("it is not valid now".to_owned());
        }
        let subject = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok());
        if subject != Some(common_name) {
            return Some(format!(
                "it is issued to {}, not {common_name}",
                subject.unwrap_or("no common name")
            ));
        }
        let found = match cert.subject_alternative_name() {
            Ok(Some(san)) => san.value.general_names.iter().map(san_text).collect(),
            Ok(None) => Vec::new(),
            Err(e) => return Some(format!("its names do not parse: {e}")),
        };
        // As rcgen reads them: an address where one parses, else a DNS name.
        let wanted: Vec<String> = names
            .iter()
            .map(|n| {
                n.parse::<IpAddr>()
                    .map_or_else(|_| n.clone(), |ip| ip.to_string())
            })
            .collect();
        if found != wanted {
            return Some(format!(
                "it names {} where it should name {}",
                found.join(", "),
                wanted.join(", ")
            ));
        }
        match rcgen::KeyPair::from_pem(&issued.key_pem) {
            Err(e) => Some(format!("its key does not parse: {e}")),
            Ok(key)
                if rcgen::PublicKeyData::subject_public_key_info(&key) != cert.public_key().raw =>
            {
                Some("its key is not the certificate's".to_owned())
            }
            Ok(_) => None,
        }
    }

    /// A certificate for `names` (DNS names and IP addresses: every name
    /// the process is reached by), good as server and as client.
    pub fn issue(&self, common_name: &str, names: &[String]) -> Result<Issued, TlsError> {
        let what = format!("a certificate for {common_name}");
        let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(generate(&what))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = p256().map_err(generate(&what))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate(&what))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A client config for a process that holds the CA itself (the
    /// orchestrator: its load generator, probes and Control client), with
    /// a certificate of its own issued in memory for mtls.
    pub fn client_config(
        &self,
        name: &str,
        mutual: bool,
        resumption: bool,
    ) -> Result<Arc<ClientConfig>, TlsError> {
        let identity = if mutual {
            let issued = self.issue(name, &["127.0.0.1".to_owned(), "localhost".to_owned()])?;
            let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::Pem {
                    path: PathBuf::from(name),
                    what: e.to_string(),
                })?;
            let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).map_err(|e| {
                TlsError::Pem {
                    path: PathBuf::from(name),
                    what: e.to_string(),
                }
            })?;
            Some((chain, key))
        } else {
            None
        };
        client_config(&[self.cert_der()], identity, resumption)
    }

    /// Issues a certificate for `names` and writes it into `dir` as
    /// `<stem>.crt` and `<stem>.key` (mode 0600), beside the CA's
    /// `ca.crt` (written if missing); the files for a process's config.
    pub fn write_files(
        &self,
        dir: &Path,
        stem: &str,
        names: &[String],
        mutual: bool,
        resumption: bool,
    ) -> Result<TlsFiles, TlsError> {
        let ca = dir.join("ca.crt");
        if !ca.exists() {
            write(&ca, self.cert_pem().as_bytes(), 0o644)?;
        }
        let issued = self.issue(stem, names)?;
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        write(&cert, issued.cert_pem.as_bytes(), 0o644)?;
        write(&key, issued.key_pem.as_bytes(), 0o600)?;
        Ok(TlsFiles {
            ca,
            cert,
            key,
            mutual,
            resumption,
        })
    }
}

/// A subject alternative name as [`Authority::issue`] was given it.
fn san_text(name: &x509_parser::extensions::GeneralName<'_>) -> String {
    use x509_parser::extensions::GeneralName;
    match name {
        GeneralName::DNSName(dns) => (*dns).to_owned(),
        GeneralName::IPAddress(octets) => match octets.len() {
            4 => <[u8; 4]>::try_from(*octets)
                .map_or_else(|_| format!("{octets:?}"), |o| IpAddr::from(o).to_string()),
            _ => <[u8; 16]>::try_from(*octets)
                .map_or_else(|_| format!("{octets:?}"), |o| IpAddr::from(o).to_string()),
        },
        other => other.to_string(),
    }
}

/// Writes `contents` to a new `path` created with `mode` (a key is never
/// readable by others, not even for a moment), replacing a file there.
fn write(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let _ = std::fs::remove_file(path);
    write_new(path, contents, mode).map_err(|source| TlsError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Writes `contents` to `path`, which must not exist, creating it with
/// `mode` (0600 for a private key: never readable by others, not even
/// for a moment). The one writer of TLS files, the run's and a
/// deployment's.
pub fn write_new(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(contents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn identity(
        ca: &Authority,
        names: &[&str],
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let issued = ca.issue("test", &names).expect("issue");
        let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("cert pem");
        let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key pem");
        (chain, key)
    }

    /// A server on loopback that echoes one byte per connection after its
    /// handshake; the client's result.
    async fn handshake(
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
    ) -> io::Result<HandshakeKind> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await?;
            let mut tls = acceptor.accept(tcp).await?;
            let mut byte = [0u8; 1];
            tls.read_exact(&mut byte).await?;
            tls.write_all(&byte).await?;
            tls.shutdown().await?;
            io::Result::Ok(())
        });
        let tcp = TcpStream::connect(addr).await?;
        let outcome = async {
            let (mut tls, kind) = connect(tcp, client, "127.0.0.1").await?;
            tls.write_all(b"x").await?;
            let mut byte = [0u8; 1];
            tls.read_exact(&mut byte).await?;
            io::Result::Ok(kind)
        }
        .await;
        let served = served.await.expect("server task");
        let kind = outcome?;
        served?;
        Ok(kind)
    }

    #[tokio::test]
    async fn a_certificate_from_the_run_ca_verifies_and_a_second_connection_resumes() {
        let ca = Authority::new("test CA").expect("CA");
        let (chain, key) = identity(&ca, &["127.0.0.1", "localhost"]);
        let server = server_config(&[ca.cert_der()], chain, key, false).expect("server");
        let client = client_config(&[ca.cert_der()], None, true).expect("client");
        let first = handshake(server.clone(), client.clone())
            .await
            .expect("first");
        assert_eq!(first, HandshakeKind::Full);
        let second = handshake(server, client).await.expect("second");
        assert_eq!(second, HandshakeKind::Resumed);
    }

    #[tokio::test]
    async fn without_resumption_every_handshake_is_full() {
        let ca = Authority::new("test CA").expect("CA");
        let (chain, key) = identity(&ca, &["127.0.0.1"]);
        let server = server_config(&[ca.cert_der()], chain, key, false).expect("server");
        let client = client_config(&[ca.cert_der()], None, false).expect("client");
        for _ in 0..2 {
            let kind = handshake(server.clone(), client.clone())
                .await
                .expect("handshake");
            assert_eq!(kind, HandshakeKind::Full);
        }
    }

    #[tokio::test]
    async fn a_certificate_from_another_ca_is_refused() {
        let ca = Authority::new("test CA").expect("CA");
        let other = Authority::new("another CA").expect("CA");
        let (chain, key) = identity(&other, &["127.0.0.1"]);
        let server = server_config(&[other.cert_der()], chain, key, false).expect("server");
        let client = client_config(&[ca.cert_der()], None, true).expect("client");
        let error = handshake(server, client)
            .await
            .expect_err("another CA's cert");
        assert!(
            error.to_string().contains("UnknownIssuer"),
            "unexpected error: {error}"
        );
    }

    #[tokio::test]
    async fn a_certificate_for_another_name_is_refused() {
        let ca = Authority::new("test CA").expect("CA");
        let (chain, key) = identity(&ca, &["hop-b.example"]);
        let server = server_config(&[ca.cert_der()], chain, key, false).expect("server");
        let client = client_config(&[ca.cert_der()], None, true).expect("client");
        handshake(server, client)
            .await
            .expect_err("cert for another name");
    }

    #[tokio::test]
    async fn mtls_refuses_a_client_without_a_certificate_and_takes_one_with() {
        let ca = Authority::new("test CA").expect("CA");
        let (chain, key) = identity(&ca, &["127.0.0.1"]);
        let server =
            server_config(&[ca.cert_der()], chain.clone(), key.clone_key(), true).expect("server");
        let anonymous = client_config(&[ca.cert_der()], None, true).expect("client");
        handshake(server.clone(), anonymous)
            .await
            .expect_err("a client without a certificate");

        let other = Authority::new("another CA").expect("CA");
        let foreign =
            client_config(&[ca.cert_der()], Some(identity(&other, &["x"])), true).expect("client");
        handshake(server.clone(), foreign)
            .await
            .expect_err("a client certificate from another CA");

        let own = client_config(&[ca.cert_der()], Some((chain, key)), true).expect("client");
        assert_eq!(
            handshake(server, own).await.expect("with a certificate"),
            HandshakeKind::Full
        );
    }

    #[tokio::test]
    async fn a_ca_read_back_from_its_pem_issues_what_its_first_self_trusts() {
        let ca = Authority::new("kept CA").expect("CA");
        let kept = Authority::from_pem(&ca.cert_pem(), &ca.key_pem()).expect("read back");
        assert_eq!(kept.cert_pem(), ca.cert_pem());
        // A certificate from the CA read back verifies against the first
        // one's certificate.
        let (chain, key) = identity(&kept, &["127.0.0.1"]);
        let server = server_config(&[ca.cert_der()], chain, key, false).expect("server");
        let client = client_config(&[ca.cert_der()], None, true).expect("client");
        assert_eq!(
            handshake(server, client).await.expect("verified"),
            HandshakeKind::Full
        );

        // Refused: another CA's key, and a certificate that is no CA's.
        let other = Authority::new("other CA").expect("CA");
        let error = Authority::from_pem(&ca.cert_pem(), &other.key_pem())
            .expect_err("another key")
            .to_string();
        assert!(error.contains("not the certificate's"), "{error}");
        let leaf = ca.issue("hop-a-0", &["hop-a-0".to_owned()]).expect("leaf");
        let error = Authority::from_pem(&leaf.cert_pem, &leaf.key_pem)
            .expect_err("a leaf")
            .to_string();
        assert!(error.contains("not a CA's"), "{error}");
    }

    #[test]
    fn an_issued_certificate_is_kept_only_for_its_ca_names_and_key() {
        let ca = Authority::new("kept CA").expect("CA");
        let names = ["hop-a-0".to_owned(), "127.0.0.1".to_owned()];
        let issued = ca.issue("hop-a-0", &names).expect("issue");
        assert_eq!(ca.mismatch(&issued, "hop-a-0", &names), None);
        let kept = Authority::from_pem(&ca.cert_pem(), &ca.key_pem()).expect("read back");
        assert_eq!(kept.mismatch(&issued, "hop-a-0", &names), None);

        let why = |ca: &Authority, issued: &Issued, cn: &str, names: &[String]| {
            ca.mismatch(issued, cn, names).unwrap_or_default()
        };
        let other = Authority::new("kept CA").expect("a CA of the same name");
        assert!(why(&other, &issued, "hop-a-0", &names).contains("another CA"));
        assert!(why(&ca, &issued, "hop-b-0", &names).contains("not hop-b-0"));
        let fewer = ["hop-a-0".to_owned()];
        assert!(why(&ca, &issued, "hop-a-0", &fewer).contains("where it should name hop-a-0"));
        let mut swapped = issued.clone();
        swapped.key_pem = ca.issue("hop-a-0", &names).expect("issue").key_pem;
        assert!(why(&ca, &swapped, "hop-a-0", &names).contains("not the certificate's"));
        let mut garbled = issued.clone();
        garbled.cert_pem = "not a certificate".to_owned();
        assert!(why(&ca, &garbled, "hop-a-0", &names).contains("not PEM"));
    }

    #[test]
    fn written_keys_are_private_and_load() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tailmesh-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = Authority::new("test CA").expect("CA");
        let files = ca
            .write_files(&dir, "hop-a-0", &["127.0.0.1".to_owned()], true, true)
            .expect("write");
        let mode = std::fs::metadata(&files.key)
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let tls = files.load().expect("load");
        assert!(tls.mutual);
        assert!(tls.client.client_auth_cert_resolver.has_certs());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

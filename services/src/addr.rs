//! [`PeerAddr`]: where a hop, the broker or a fault agent is reached. On one
//! machine that is an IP address and port handed over by the launcher; in a
//! container network or a cluster it is a service name and port
//! (`hop-middle-1:7000`), looked up at every connection, so a container
//! that restarts with a new address is still found.

use std::{fmt, net::SocketAddr, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a text is not a [`PeerAddr`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// The host is empty or longer than a DNS name can be.
    #[error("{host:?} is not a host name (1 to 253 characters)")]
    HostLength {
        /// The host as given.
        host: String,
    },
    /// A dot-separated part of the host is not a DNS label.
    #[error(
        "{host:?} is not a host name: {label:?} is not a DNS label \
         (1 to 63 letters, digits and '-', not starting or ending with '-')"
    )]
    NotDnsLabel {
        /// The host as given.
        host: String,
        /// The offending label.
        label: String,
    },
    /// Port 0, which no service listens on.
    #[error("{host}: port 0 names no service")]
    PortZero { host: String },
    /// No `:` separates a host from a port.
    #[error("{text:?} is not host:port")]
    NotHostPort {
        /// The text as given.
        text: String,
    },
    /// What follows the last `:` is not a port number.
    #[error("{text:?}: {port:?} is not a port")]
    NotPort {
        /// The text as given.
        text: String,
        /// The port part.
        port: String,
    },
    /// `host:port` text whose host or port is refused.
    #[error("{text:?}: {problem}")]
    Invalid {
        /// The text as given.
        text: String,
        /// What is wrong with its host or port.
        problem: Box<AddrError>,
    },
}

/// A host (IP address or DNS name) and a port, written `host:port`
/// (`[::1]:7000` for IPv6). In JSON it is that string, so a plain socket
/// address reads as one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerAddr {
    host: String,
    port: u16,
}

impl PeerAddr {
    /// `host:port`, with `host` a DNS name or an IP address.
    pub fn new(host: &str, port: u16) -> Result<Self, AddrError> {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        check_host(host)?;
        if port == 0 {
            return Err(AddrError::PortZero {
                host: host.to_owned(),
            });
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// The DNS name or IP address (without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://host:port`, the URI a tonic endpoint takes.
    pub fn uri(&self) -> String {
        format!("http://{self}")
    }
}

/// An IP address, or a DNS name: dot-separated labels of ASCII letters,
/// digits and '-', none empty, none starting or ending with '-'.
fn check_host(host: &str) -> Result<(), AddrError> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if host.is_empty() || host.len() > 253 {
        return Err(AddrError::HostLength {
            host: host.to_owned(),
        });
    }
    for label in host.split('.') {
        let plain = label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if label.is_empty()
            || label.len() > 63
            || !plain
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(AddrError::NotDnsLabel {
                host: host.to_owned(),
                label: label.to_owned(),
            });
        }
    }
    Ok(())
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for PeerAddr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| AddrError::NotHostPort { text: s.to_owned() })?;
        let port = port.parse().map_err(|_| AddrError::NotPort {
            text: s.to_owned(),
            port: port.to_owned(),
        })?;
        Self::new(host, port).map_err(|problem| AddrError::Invalid {
            text: s.to_owned(),
            problem: Box::new(problem),
        })
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        Self {
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }
}

impl From<&SocketAddr> for PeerAddr {
    fn from(addr: &SocketAddr) -> Self {
        Self::from(*addr)
    }
}

impl From<&PeerAddr> for PeerAddr {
    fn from(addr: &PeerAddr) -> Self {
        addr.clone()
    }
}

impl Serialize for PeerAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PeerAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_and_service_names_round_trip() {
        for text in [
            "127.0.0.1:7000",
            "[::1]:7000",
            "hop-middle-1:7000",
            "broker.ns.svc:7000",
        ] {
            let addr: PeerAddr = text.parse().expect(text);
            assert_eq!(addr.to_string(), text);
            assert_eq!(addr.uri(), format!("http://{text}"));
        }
        let socket: SocketAddr = "[::1]:80".parse().expect("an address");
        assert_eq!(PeerAddr::from(socket).to_string(), "[::1]:80");
        // JSON carries the same text, so configs holding socket addresses
        // read unchanged.
        let json = serde_json::to_string(&PeerAddr::from(socket)).expect("json");
        assert_eq!(json, "\"[::1]:80\"");
        let back: PeerAddr = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, PeerAddr::from(socket));
    }

    #[test]
    fn what_is_not_host_and_port_is_refused_and_named() {
        for bad in [
            "hop-b-1",
            "hop_b:7000",
            "-hop:7000",
            "hop-:7000",
            ":7000",
            "hop:0",
            "hop:70000",
            "hop:x",
            "a..b:1",
        ] {
            let error = bad.parse::<PeerAddr>().expect_err(bad).to_string();
            assert!(error.contains(&format!("{bad:?}")), "{bad}: {error}");
        }
        let said = |text: &str| text.parse::<PeerAddr>().expect_err(text).to_string();
        assert_eq!(said("hop-b-1"), r#""hop-b-1" is not host:port"#);
        assert_eq!(said("hop:x"), r#""hop:x": "x" is not a port"#);
        assert_eq!(said("hop:0"), r#""hop:0": hop: port 0 names no service"#);
        assert_eq!(
            said(":7000"),
            r#"":7000": "" is not a host name (1 to 253 characters)"#
        );
        assert_eq!(
            said("hop_b:7000"),
            r#""hop_b:7000": "hop_b" is not a host name: "hop_b" is not a DNS label (1 to 63 letters, digits and '-', not starting or ending with '-')"#
        );
        let json = serde_json::from_str::<PeerAddr>("\"hop b:1\"").expect_err("a space");
        assert!(json.to_string().contains("not a DNS label"), "{json}");
    }
}

//! HBONE errors, each saying which side failed and what was expected.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use ferry_core::identity::Identity;

/// Which side of a tunnel an error came from: what a proxy's logs and metrics need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The peer that opened the tunnel (or our local client).
    Downstream,
    /// The peer we dialled: the remote HBONE server or the tunnel's target.
    Upstream,
    /// Our own configuration or state.
    Local,
}

/// An HBONE failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("TCP connect to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("TLS handshake with {addr} failed: {source}")]
    Handshake { addr: SocketAddr, source: io::Error },
    #[error("TLS handshake with {addr} refused: {mismatch}")]
    PeerIdentity {
        addr: SocketAddr,
        mismatch: IdentityMismatch,
    },
    #[error("peer {addr} presented an unacceptable certificate: {reason}")]
    PeerCertificate { addr: SocketAddr, reason: TlsError },
    #[error("peer {addr} did not negotiate ALPN \"h2\" (found {found:?})")]
    Alpn {
        addr: SocketAddr,
        found: Option<String>,
    },
    #[error("HTTP/2 with {addr} failed: {source}")]
    H2 { addr: SocketAddr, source: h2::Error },
    #[error("CONNECT {authority} via {addr} was refused with HTTP status {status}")]
    Refused {
        addr: SocketAddr,
        authority: String,
        status: u16,
    },
    #[error("CONNECT authority {0:?} is not a valid request target")]
    BadAuthority(String),
    #[error("TLS configuration: {0}")]
    Config(#[from] TlsError),
    #[error("timed out after {after_ms} ms while {doing}")]
    Timeout { doing: &'static str, after_ms: u64 },
}

impl Error {
    pub fn side(&self) -> Side {
        match self {
            Self::Connect { .. }
            | Self::Handshake { .. }
            | Self::PeerIdentity { .. }
            | Self::Alpn { .. }
            | Self::H2 { .. }
            | Self::Refused { .. }
            | Self::Timeout { .. } => Side::Upstream,
            Self::PeerCertificate { .. } => Side::Downstream,
            Self::BadAuthority(_) | Self::Config(_) => Side::Local,
        }
    }
}

/// A TLS set-up problem.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error("bad certificate: {0}")]
    Certificate(String),
    #[error("bad private key: {0}")]
    Key(String),
    #[error("bad trust bundle: {0}")]
    Bundle(String),
    #[error("rustls rejected the configuration: {0}")]
    Rustls(String),
}

/// The peer presented a valid chain, but not an identity the decision expects.
#[derive(Clone)]
pub struct IdentityMismatch {
    pub expected: Vec<Identity>,
    pub found: Vec<Identity>,
}

impl fmt::Display for IdentityMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |ids: &[Identity]| {
            ids.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "peer identity mismatch: expected one of [{}], found [{}]",
            list(&self.expected),
            list(&self.found)
        )
    }
}

impl fmt::Debug for IdentityMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for IdentityMismatch {}

impl IdentityMismatch {
    /// Finds the mismatch inside a failed handshake's I/O error, if that is why it failed.
    pub fn find(e: &std::io::Error) -> Option<&Self> {
        let inner = e.get_ref()?.downcast_ref::<rustls::Error>()?;
        match inner {
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
                other.0.downcast_ref::<Self>()
            }
            _ => None,
        }
    }
}

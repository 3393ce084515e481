//! HBONE errors, each saying which side failed and what was expected.

use std::io;
use std::net::SocketAddr;

use ferry_tls::error::{IdentityMismatch, TlsError};

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

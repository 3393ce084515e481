//! TLS errors: a credential or trust bundle that cannot be used, and a peer whose valid
//! certificate names an identity the caller did not expect.

use std::fmt;

use ferry_core::identity::Identity;

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

//! The cluster a workload certificate was issued for, bound into it by the mesh CA.
//!
//! The CA knows which node (and so which cluster) holds the key of every certificate it signs:
//! it signs an identity only for the node proxy of a workload with that identity (or for the
//! gateway or waypoint itself). It writes that cluster into the certificate as a private,
//! **non-critical** X.509 extension:
//!
//! ```text
//! Extension ::= SEQUENCE {
//!     extnID     OBJECT IDENTIFIER  -- 2.25.7205494753481155080 (CLUSTER_OID)
//!     critical   BOOLEAN DEFAULT FALSE  -- absent: never critical
//!     extnValue  OCTET STRING       -- the DER of: UTF8String (the cluster name, non-empty)
//! }
//! ```
//!
//! A peer that does not know the extension ignores it: RFC 5280 §4.2 lets a relying party ignore
//! an unrecognized non-critical extension, and webpki (which Istio's ztunnel verifies with, as we
//! do) returns `UnsupportedCriticalExtension` only for unknown extensions marked critical
//! (rustls-webpki `src/x509.rs`, `Extension::unsupported`). Every hop reads the cluster back only
//! from a peer certificate rustls has already verified against the trust bundle
//! ([`crate::config::peer_cluster`]), so it is as trustworthy as the identity beside it.
//!
//! The OID: Ferry has no IANA Private Enterprise Number, so it sits under the `2.25` arc of
//! ITU-T X.667 (OIDs from UUIDs) with a random 63-bit value. rcgen writes OID arcs as `u64`, so a
//! full 128-bit UUID cannot be used; a value below 2^64 cannot equal a generated UUID (whose
//! version bits lie above 2^76). Replace it with an arc under a registered PEN if Ferry gets one.

use std::sync::LazyLock;

use ferry_core::model::ClusterId;
use rustls::pki_types::CertificateDer;
use x509_parser::der_parser::oid::Oid;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::TlsError;

/// The extension's OID, as rcgen takes it: 2.25.7205494753481155080.
pub const CLUSTER_OID: &[u64] = &[2, 25, 7_205_494_753_481_155_080];

static OID: LazyLock<Oid<'static>> = LazyLock::new(|| Oid::from(CLUSTER_OID).expect("a valid OID"));

/// The extension's value (`extnValue`'s content): the DER of a UTF8String naming `cluster`.
pub fn extension_value(cluster: &ClusterId) -> Vec<u8> {
    yasna::construct_der(|w| w.write_utf8_string(cluster.as_str()))
}

/// The cluster bound into `cert`, or `None` if it carries no such extension (a certificate from
/// another trust source, such as istiod). A malformed or empty value, or one marked critical, is
/// an error: the mesh CA never writes one.
///
/// This reads the certificate; it does not verify it. Call it only on a certificate that has
/// been verified (a handshake's peer certificate), or the answer is whatever its maker wrote.
pub fn cluster_of(cert: &CertificateDer<'_>) -> Result<Option<ClusterId>, TlsError> {
    let (_, x509) = X509Certificate::from_der(cert.as_ref())
        .map_err(|e| TlsError::Certificate(format!("cannot parse certificate: {e}")))?;
    let mut found = x509.extensions().iter().filter(|e| e.oid == *OID);
    let Some(ext) = found.next() else {
        return Ok(None);
    };
    let bad = |why: String| TlsError::Certificate(format!("cluster extension: {why}"));
    if found.next().is_some() {
        return Err(bad("present more than once".into()));
    }
    if ext.critical {
        return Err(bad("marked critical".into()));
    }
    let name = yasna::parse_der(ext.value, |r| r.read_utf8string())
        .map_err(|e| bad(format!("not a DER UTF8String: {e}")))?;
    if name.is_empty() {
        return Err(bad("empty cluster name".into()));
    }
    Ok(Some(ClusterId::new(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_a_der_utf8_string() {
        assert_eq!(
            extension_value(&ClusterId::new("east")),
            [0x0c, 4, b'e', b'a', b's', b't']
        );
    }

    #[test]
    fn the_oid_is_the_documented_one() {
        assert_eq!(OID.to_id_string(), "2.25.7205494753481155080");
    }
}

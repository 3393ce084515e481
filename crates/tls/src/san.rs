//! SPIFFE identities carried in certificates as URI subject alternative names.

use ferry_core::identity::Identity;
use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::TlsError;

/// Every SPIFFE workload identity in the certificate's URI SANs. Other URIs are ignored; a
/// `spiffe://` URI that is not a well-formed workload identity is an error, not skipped.
pub(crate) fn spiffe_identities(cert: &CertificateDer<'_>) -> Result<Vec<Identity>, TlsError> {
    let (_, x509) = X509Certificate::from_der(cert.as_ref())
        .map_err(|e| TlsError::Certificate(format!("cannot parse certificate: {e}")))?;
    let mut out = Vec::new();
    let san = x509.subject_alternative_name().map_err(|e| {
        TlsError::Certificate(format!("cannot parse subject alternative names: {e}"))
    })?;
    if let Some(san) = san {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && uri.starts_with("spiffe://")
            {
                out.push(uri.parse().map_err(|e| {
                    TlsError::Certificate(format!(
                        "URI SAN {uri:?} is not a SPIFFE workload identity: {e}"
                    ))
                })?);
            }
        }
    }
    Ok(out)
}

/// The one SPIFFE identity a workload certificate must carry.
pub(crate) fn single_identity(cert: &CertificateDer<'_>) -> Result<Identity, TlsError> {
    let ids = spiffe_identities(cert)?;
    match ids.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(TlsError::Certificate(
            "certificate has no SPIFFE URI SAN".into(),
        )),
        many => Err(TlsError::Certificate(format!(
            "certificate has {} SPIFFE URI SANs, expected exactly one",
            many.len()
        ))),
    }
}

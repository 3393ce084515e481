//! Reading a certificate signing request: its signature, its SPIFFE identity, its key.

use ferry_core::identity::Identity;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_SIG_ED25519,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

/// Why a CSR cannot be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("the CSR is not valid PEM: {0}")]
    Pem(String),
    #[error("the CSR cannot be parsed: {0}")]
    Parse(String),
    #[error("the CSR's SAN must be exactly one SPIFFE identity, found {0}")]
    San(String),
    #[error(
        "weak or unsupported key: {0} (accepted: ECDSA P-256 or P-384, Ed25519, RSA of 2048 bits or more)"
    )]
    Key(String),
}

/// What the CA needs from a CSR: the DER, and the one identity it asks for.
#[derive(Debug, Clone)]
pub struct Csr {
    pub der: Vec<u8>,
    pub identity: Identity,
}

/// Parses a PEM CSR and checks its key. The signature is checked when it is signed.
pub fn parse(pem: &str) -> Result<Csr, CsrError> {
    let der = pem_to_der(pem)?;
    let (_, req) =
        X509CertificationRequest::from_der(&der).map_err(|e| CsrError::Parse(e.to_string()))?;
    check_key(&req)?;
    let identity = identity(&req)?;
    Ok(Csr { der, identity })
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>, CsrError> {
    let (label, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map(|(_, p)| (p.label, p.contents))
        .map_err(|e| CsrError::Pem(e.to_string()))?;
    if label != "CERTIFICATE REQUEST" && label != "NEW CERTIFICATE REQUEST" {
        return Err(CsrError::Pem(format!(
            "expected a CERTIFICATE REQUEST block, found {label:?}"
        )));
    }
    Ok(der)
}

fn identity(req: &X509CertificationRequest<'_>) -> Result<Identity, CsrError> {
    let mut uris = Vec::new();
    for ext in req.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::URI(u) => uris.push((*u).to_string()),
                    other => return Err(CsrError::San(format!("a non-URI name {other:?}"))),
                }
            }
        }
    }
    match uris.as_slice() {
        [one] => one
            .parse()
            .map_err(|e| CsrError::San(format!("{one:?} ({e})"))),
        [] => Err(CsrError::San("none".into())),
        many => Err(CsrError::San(format!(
            "{} URIs: {}",
            many.len(),
            many.join(", ")
        ))),
    }
}

fn check_key(req: &X509CertificationRequest<'_>) -> Result<(), CsrError> {
    let spki = &req.certification_request_info.subject_pki;
    let alg = &spki.algorithm.algorithm;
    if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .ok_or_else(|| CsrError::Key("EC key without a named curve".into()))?;
        if curve == OID_EC_P256 || curve == OID_NIST_EC_P384 {
            return Ok(());
        }
        return Err(CsrError::Key(format!("EC curve {curve}")));
    }
    if *alg == OID_SIG_ED25519 {
        return Ok(());
    }
    if *alg == OID_PKCS1_RSAENCRYPTION {
        return match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) if rsa.key_size() >= 2048 => Ok(()),
            Ok(PublicKey::RSA(rsa)) => {
                Err(CsrError::Key(format!("RSA key of {} bits", rsa.key_size())))
            }
            _ => Err(CsrError::Key("unreadable RSA key".into())),
        };
    }
    Err(CsrError::Key(format!("key algorithm {alg}")))
}

//! The CA's signing key and root, and signing of workload certificates.

use std::path::Path;
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_core::model::ClusterId;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, CustomExtension,
    DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType, SerialNumber,
};
use rustls_pki_types::CertificateSigningRequestDer;
use time::OffsetDateTime;

use crate::ca::csr::{self, CsrError};

/// Why signing failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error(
        "the CSR's signature does not verify, or it carries an extension the CA does not sign ({0})"
    )]
    Request(rcgen::Error),
    #[error("signing failed: {0}")]
    Sign(rcgen::Error),
}

/// Why the CA's own key and root could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// A CA: one signing key and its certificate, plus extra trusted roots (for rotation).
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// PEM roots distributed as the trust bundle: this CA's root first, then any extra roots.
    bundle: Vec<String>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("roots", &self.bundle.len())
            .finish_non_exhaustive()
    }
}

/// Clock skew allowance: certificates are valid from a minute before they are signed.
const BACKDATE: Duration = Duration::from_secs(60);

impl Ca {
    /// A new self-signed root for `trust_domain`.
    pub fn generate(trust_domain: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let params = root_params(trust_domain)?;
        let cert_pem = params.self_signed(&key)?.pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            bundle: vec![cert_pem.clone()],
            cert_pem,
        })
    }

    /// From a PEM certificate and key (an existing root or intermediate).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("bad key: {e}"))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| format!("bad certificate: {e}"))?;
        Ok(Self {
            issuer,
            cert_pem: cert_pem.to_string(),
            bundle: vec![cert_pem.to_string()],
        })
    }

    /// Loads `ca-cert.pem` and `ca-key.pem` from `dir`, or creates them (key mode 0600) on first
    /// start, so that restarts keep the same trust root.
    pub fn load_or_create(dir: &Path, trust_domain: &str) -> Result<Self, LoadError> {
        let cert_path = dir.join("ca-cert.pem");
        let key_path = dir.join("ca-key.pem");
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| LoadError::Io { path, source }
        };
        if cert_path.exists() || key_path.exists() {
            let cert = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
            let key = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
            return Self::from_pem(&cert, &key).map_err(|reason| LoadError::Invalid {
                path: dir.display().to_string(),
                reason,
            });
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let ca = Self::generate(trust_domain).map_err(|e| LoadError::Invalid {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        crate::ca::write_private(&key_path, ca.issuer.key().serialize_pem().as_bytes())
            .map_err(io(&key_path))?;
        std::fs::write(&cert_path, &ca.cert_pem).map_err(io(&cert_path))?;
        tracing::info!(path = %cert_path.display(), "created a new mesh root");
        Ok(ca)
    }

    /// Adds roots that peers may still present (the old root during a rotation).
    pub fn with_extra_roots(mut self, pems: impl IntoIterator<Item = String>) -> Self {
        self.bundle.extend(pems);
        self
    }

    /// This CA's certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The trust bundle (PEM roots, this CA's first).
    pub fn bundle(&self) -> &[String] {
        &self.bundle
    }

    /// Signs `csr_pem` for `identity` (which the CSR must name, and nothing else) for `lifetime`,
    /// binding `cluster` (the cluster of the node or gateway that holds the key, as
    /// [`crate::ca::authz::authorize`] found it) into the certificate: a non-critical extension
    /// under [`ferry_tls::cluster::CLUSTER_OID`] that peers not knowing it ignore.
    /// Returns the chain: the new leaf, then the trust bundle's roots.
    pub fn sign(
        &self,
        csr_pem: &str,
        identity: &Identity,
        cluster: &ClusterId,
        lifetime: Duration,
    ) -> Result<Vec<String>, SignError> {
        let parsed = csr::parse(csr_pem)?;
        if &parsed.identity != identity {
            return Err(CsrError::San(format!(
                "{} while {identity} was requested",
                parsed.identity
            ))
            .into());
        }
        let der = CertificateSigningRequestDer::from(parsed.der);
        let mut req =
            CertificateSigningRequestParams::from_der(&der).map_err(SignError::Request)?;
        // The CA decides everything but the key: names, usages, validity, cluster. Extensions
        // the CSR asked for are dropped, so a requester cannot bring its own cluster.
        let now = OffsetDateTime::now_utc();
        let p = &mut req.params;
        p.subject_alt_names =
            vec![SanType::URI(identity.to_string().try_into().map_err(
                |e: rcgen::Error| SignError::Csr(CsrError::San(e.to_string())),
            )?)];
        p.distinguished_name = DistinguishedName::new();
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.not_before = now - BACKDATE;
        p.not_after = now + lifetime;
        p.serial_number = Some(SerialNumber::from_slice(&random_serial()));
        p.use_authority_key_identifier_extension = true;
        p.custom_extensions = vec![CustomExtension::from_oid_content(
            ferry_tls::cluster::CLUSTER_OID,
            ferry_tls::cluster::extension_value(cluster),
        )];
        let leaf = req.signed_by(&self.issuer).map_err(SignError::Sign)?;
        let mut chain = vec![leaf.pem()];
        chain.extend(self.bundle.iter().cloned());
        Ok(chain)
    }
}

impl Ca {
    /// A serving certificate for the control plane's own gRPC endpoint, valid for `names` (DNS)
    /// and `ips`. Returns (chain PEM, key PEM). Nodes verify it against the trust bundle.
    pub fn issue_server_cert(
        &self,
        names: &[String],
        ips: &[std::net::IpAddr],
        lifetime: Duration,
    ) -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + lifetime;
        params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((
            format!("{}{}", cert.pem(), self.cert_pem),
            key.serialize_pem(),
        ))
    }
}

fn root_params(trust_domain: &str) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, trust_domain);
    dn.push(DnType::CommonName, "Ferry mesh root");
    params.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::from_secs(10 * 365 * 24 * 3600);
    params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
    Ok(params)
}

fn random_serial() -> [u8; 16] {
    use aws_lc_rs::rand::{SecureRandom, SystemRandom};
    let mut s = [0u8; 16];
    // A failure leaves zeros; the serial only has to differ, and the system RNG does not fail.
    let _ = SystemRandom::new().fill(&mut s);
    s[0] &= 0x7f; // positive
    s
}

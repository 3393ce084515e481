//! A throwaway CA and per-identity certificate factory for tests (feature `testkit`).

use ferry_core::identity::Identity;
use ferry_core::model::ClusterId;
use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::config::{Credentials, TrustBundle};

/// A self-signed root that issues workload certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    root: CertificateDer<'static>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new root named `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("generate CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, name);
        params.distinguished_name = dn;
        let root = params
            .self_signed(&key)
            .expect("self-sign CA")
            .der()
            .clone();
        Self {
            issuer: Issuer::new(params, key),
            root,
        }
    }

    pub fn root(&self) -> CertificateDer<'static> {
        self.root.clone()
    }

    /// A bundle holding only this root.
    pub fn bundle(&self) -> TrustBundle {
        TrustBundle::from_der([self.root()]).expect("valid root")
    }

    /// Workload credentials for `id` (ECDSA P-256, SPIFFE URI SAN, serverAuth + clientAuth).
    pub fn issue(&self, id: &Identity) -> Credentials {
        self.issue_sans(&[id.to_string()])
    }

    /// Credentials for an identity given as text, e.g. `spiffe://cluster.local/ns/a/sa/b`.
    pub fn issue_str(&self, id: &str) -> Credentials {
        self.issue(&id.parse().expect("test identity"))
    }

    /// Workload credentials for `id` with `cluster` bound in, as the mesh CA issues them
    /// ([`crate::cluster`]).
    pub fn issue_in(&self, id: &Identity, cluster: &ClusterId) -> Credentials {
        self.issue_with(&[id.to_string()], Some(cluster))
    }

    /// Credentials with the given URI SANs (which must include exactly one SPIFFE identity).
    pub fn issue_sans(&self, uris: &[String]) -> Credentials {
        self.issue_with(uris, None)
    }

    /// Credentials with the given URI SANs and, if `cluster` is given, the cluster extension.
    pub fn issue_with(&self, uris: &[String], cluster: Option<&ClusterId>) -> Credentials {
        let key = KeyPair::generate().expect("generate key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(u.as_str().try_into().expect("ia5 URI")))
            .collect();
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if let Some(c) = cluster {
            params.custom_extensions = vec![CustomExtension::from_oid_content(
                crate::cluster::CLUSTER_OID,
                crate::cluster::extension_value(c),
            )];
        }
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Credentials::from_der(vec![cert.der().clone(), self.root()], key)
            .expect("valid credentials")
    }
}

/// Moves what `from` has to send into `to`, in memory (a handshake without sockets): the first
/// error `to` finds in it.
pub fn pass(
    from: &mut rustls::ConnectionCommon<impl rustls::SideData>,
    to: &mut rustls::ConnectionCommon<impl rustls::SideData>,
) -> Result<(), rustls::Error> {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).expect("written to memory");
    }
    let mut rd = wire.as_slice();
    while !rd.is_empty() {
        to.read_tls(&mut rd).expect("read from memory");
        to.process_new_packets()?;
    }
    Ok(())
}

//! TLS for HBONE: rustls, TLS 1.3 only, AES-GCM suites, ALPN `h2`, SPIFFE identities.
//!
//! - The **client** accepts a server only if its certificate chains to the trust bundle (with the
//!   serverAuth usage) *and* carries one of the SPIFFE identities the routing decision expects.
//!   It sends no SNI and never resumes sessions (as Istio's ztunnel).
//! - The **server** requires a client certificate that chains to the trust bundle (clientAuth
//!   usage) and carries exactly one SPIFFE identity in the server's own trust domain; that
//!   identity is what authorization sees.
//!
//! The crypto provider is aws-lc-rs (AES-GCM in hardware, and the only provider that builds here
//! without extra tools); only the two AES-GCM TLS 1.3 suites are offered.

use std::fmt;
use std::sync::{Arc, OnceLock};

use ferry_core::identity::Identity;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, Resumption};
use rustls::crypto::{CryptoProvider, aws_lc_rs};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{
    ClientHello, NoServerSessionStorage, ParsedCertificate, ResolvesServerCert,
    WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError,
    RootCertStore, ServerConfig, SignatureScheme,
};

use crate::error::{IdentityMismatch, TlsError};
use crate::san;
use crate::verified::{Usage, Verified};

/// The ALPN protocol HBONE negotiates.
pub const ALPN_H2: &[u8] = b"h2";

/// The crypto provider: aws-lc-rs restricted to the TLS 1.3 AES-GCM suites.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut p = aws_lc_rs::default_provider();
            p.cipher_suites = vec![
                aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
                aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
            ];
            Arc::new(p)
        })
        .clone()
}

/// A workload's certificate chain and private key. The key never leaves this value, and
/// `Debug` prints only the identity.
#[derive(Clone)]
pub struct Credentials {
    identity: Identity,
    certified: Arc<CertifiedKey>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// From a DER chain (leaf first) and a PKCS#8 / SEC1 / PKCS#1 key.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TlsError> {
        let leaf = chain
            .first()
            .ok_or_else(|| TlsError::Certificate("empty certificate chain".into()))?;
        let identity = san::single_identity(leaf)?;
        let signing = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsError::Key(e.to_string()))?;
        let certified = CertifiedKey::new(chain, signing);
        certified
            .keys_match()
            .map_err(|e| TlsError::Key(format!("the key does not match the certificate: {e}")))?;
        Ok(Self {
            identity,
            certified: Arc::new(certified),
        })
    }

    /// From PEM text: the chain (leaf first) and the key.
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let chain = rustls_pemfile::certs(&mut chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Certificate(format!("cannot read PEM chain: {e}")))?;
        let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
            .map_err(|e| TlsError::Key(format!("cannot read PEM key: {e}")))?
            .ok_or_else(|| TlsError::Key("no private key in PEM".into()))?;
        Self::from_der(chain, key)
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The chain, leaf first; never empty.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.certified.cert
    }

    /// The leaf (end-entity) certificate, the one naming [`Credentials::identity`]. There always
    /// is one: [`Credentials::from_der`] refuses an empty chain, and the chain never changes.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.certified.cert[0]
    }
}

/// The roots a peer's chain must lead to. Several at once, so a root can be rotated. Its clones
/// share the chains verified to it ([`crate::verified`]); a bundle made anew starts with none.
#[derive(Clone, Debug)]
pub struct TrustBundle {
    roots: Arc<RootCertStore>,
    verified: Arc<Verified>,
}

impl TrustBundle {
    pub fn from_der(
        roots: impl IntoIterator<Item = CertificateDer<'static>>,
    ) -> Result<Self, TlsError> {
        let mut store = RootCertStore::empty();
        for (i, r) in roots.into_iter().enumerate() {
            store
                .add(r)
                .map_err(|e| TlsError::Bundle(format!("root #{i}: {e}")))?;
        }
        if store.is_empty() {
            return Err(TlsError::Bundle("no root certificates".into()));
        }
        Ok(Self {
            roots: Arc::new(store),
            verified: Arc::default(),
        })
    }

    /// Whether `other` is this bundle (a clone of the same one), sharing the chains verified to
    /// it.
    pub fn is_same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.verified, &other.verified)
    }

    /// Chain verifications skipped because the same chain had been verified to this bundle
    /// before ([`crate::verified`]).
    pub fn verifications_skipped(&self) -> u64 {
        self.verified.hits()
    }

    pub fn from_pem(pem: &str) -> Result<Self, TlsError> {
        let roots = rustls_pemfile::certs(&mut pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Bundle(format!("cannot read PEM: {e}")))?;
        Self::from_der(roots)
    }

    pub fn len(&self) -> usize {
        self.roots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}

/// The TLS server configuration for one workload identity (HBONE inbound).
pub fn server_config(
    creds: &Credentials,
    bundle: &TrustBundle,
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = Arc::new(RememberedClientVerifier {
        inner: WebPkiClientVerifier::builder_with_provider(bundle.roots.clone(), provider())
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))?,
        verified: bundle.verified.clone(),
    });
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(Fixed(creds.certified.clone())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The TLS client configuration for a connection from `creds` to a peer that must present one
/// of `expected` (HBONE outbound).
pub fn client_config(
    creds: &Credentials,
    bundle: &TrustBundle,
    expected: Vec<Identity>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let verifier = SpiffeServerVerifier {
        roots: bundle.roots.clone(),
        verified: bundle.verified.clone(),
        expected,
        provider: provider(),
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(Fixed(creds.certified.clone())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.resumption = Resumption::disabled();
    config.enable_sni = false;
    Ok(Arc::new(config))
}

/// The server name a client passes to rustls: the peer's IP (no SNI is sent).
pub fn server_name(addr: std::net::SocketAddr) -> ServerName<'static> {
    ServerName::IpAddress(addr.ip().into())
}

/// The SPIFFE identity of a verified TLS peer (a client of our server).
pub fn peer_identity(
    peer_certs: Option<&[CertificateDer<'static>]>,
    trust_domain: &str,
) -> Result<Identity, TlsError> {
    let leaf = peer_certs
        .and_then(|c| c.first())
        .ok_or_else(|| TlsError::Certificate("the peer presented no certificate".into()))?;
    let id = san::single_identity(leaf)?;
    if id.trust_domain() != trust_domain {
        return Err(TlsError::Certificate(format!(
            "peer identity {id} is in trust domain {:?}, expected {trust_domain:?}",
            id.trust_domain()
        )));
    }
    Ok(id)
}

/// The cluster the mesh CA bound into a verified TLS peer's certificate (a client of our
/// server), or `None` if it carries none (another trust source, such as istiod).
///
/// `peer_certs` must be what rustls verified: a server's `peer_certificates()` after the
/// handshake (the client verifier has checked the chain to the bundle by then). Only the
/// end-entity certificate is read; see [`crate::cluster`].
pub fn peer_cluster(
    peer_certs: Option<&[CertificateDer<'static>]>,
) -> Result<Option<ferry_core::model::ClusterId>, TlsError> {
    let leaf = peer_certs
        .and_then(|c| c.first())
        .ok_or_else(|| TlsError::Certificate("the peer presented no certificate".into()))?;
    crate::cluster::cluster_of(leaf)
}

/// Serves one fixed certificate, on both the client and the server side.
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl ResolvesClientCert for Fixed {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// rustls's verifier of client chains (clientAuth, to the bundle), with the chains it verified
/// remembered per bundle ([`crate::verified`]). Everything else is the inner verifier's.
#[derive(Debug)]
struct RememberedClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    verified: Arc<Verified>,
}

impl ClientCertVerifier for RememberedClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verified
            .check(Usage::Client, end_entity, intermediates, now, || {
                self.inner
                    .verify_client_cert(end_entity, intermediates, now)
                    .map(|_| ())
            })?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

/// Chain to the bundle (serverAuth), then one of the expected SPIFFE identities. The server name
/// is ignored: HBONE authenticates workloads, not hostnames.
#[derive(Debug)]
struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    verified: Arc<Verified>,
    expected: Vec<Identity>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verified
            .check(Usage::Server, end_entity, intermediates, now, || {
                let cert = ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_cert_signed_by_trust_anchor(
                    &cert,
                    &self.roots,
                    intermediates,
                    now,
                    self.provider.signature_verification_algorithms.all,
                )
            })?;
        let found = san::spiffe_identities(end_entity).map_err(|e| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
        })?;
        if found.iter().any(|id| self.expected.contains(id)) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                OtherError(Arc::new(IdentityMismatch {
                    expected: self.expected.clone(),
                    found,
                })),
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

//! Asking the CA: a fresh key and CSR per certificate, over gRPC with the node credential.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use ferry_api::citadel::IstioCertificateRequest;
use ferry_api::citadel::istio_certificate_service_client::IstioCertificateServiceClient;
use ferry_core::identity::Identity;
use rcgen::{CertificateParams, KeyPair, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::config::Credentials;

/// Why a certificate could not be obtained.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    #[error("the CA refused: {0}")]
    Refused(String),
    #[error("the CA is unreachable: {0}")]
    Unavailable(String),
    #[error("the CA's answer is unusable: {0}")]
    BadResponse(String),
    #[error("local error: {0}")]
    Local(String),
}

/// Anything that turns an identity into credentials (the gRPC CA, or a fake in tests).
pub trait CertificateSource: Send + Sync + 'static {
    fn sign<'a>(
        &'a self,
        identity: &'a Identity,
        lifetime: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Credentials, FetchError>> + Send + 'a>>;
}

/// The CA of `ferry control`, over gRPC.
#[derive(Debug, Clone)]
pub struct GrpcCa {
    client: IstioCertificateServiceClient<Channel>,
    token: String,
    /// Reread at each request when set ([`GrpcCa::with_token_file`]).
    token_file: Option<std::path::PathBuf>,
    cluster: String,
}

impl GrpcCa {
    /// A client for `endpoint` (`https://ip:port`) whose certificate must chain to `bundle_pem`
    /// and name `server_name`. Connects lazily: a CA that is down now is retried later.
    pub fn new(
        endpoint: &str,
        bundle_pem: &str,
        server_name: &str,
        token: String,
        cluster: String,
    ) -> Result<Self, FetchError> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(bundle_pem))
            .domain_name(server_name);
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| FetchError::Local(format!("CA address {endpoint:?}: {e}")))?
            .tls_config(tls)
            .map_err(|e| FetchError::Local(format!("CA TLS: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect_lazy();
        Ok(Self {
            client: IstioCertificateServiceClient::new(channel),
            token,
            token_file: None,
            cluster,
        })
    }

    /// Rereads the credential from `path` at each request: a projected Kubernetes
    /// service-account token is rotated by the kubelet while the process runs. The token given
    /// to [`GrpcCa::new`] stands in while the file cannot be read or is empty.
    #[must_use]
    pub fn with_token_file(mut self, path: std::path::PathBuf) -> Self {
        self.token_file = Some(path);
        self
    }

    /// The credential to send now.
    fn token(&self) -> String {
        let Some(path) = &self.token_file else {
            return self.token.clone();
        };
        // A few hundred bytes on a tmpfs, read once per certificate: no need to leave the
        // runtime's thread for it.
        match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) => self.token.clone(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "the token file could not be read; sending the token read at start");
                self.token.clone()
            }
        }
    }
}

impl CertificateSource for GrpcCa {
    fn sign<'a>(
        &'a self,
        identity: &'a Identity,
        lifetime: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Credentials, FetchError>> + Send + 'a>> {
        Box::pin(async move {
            let (csr, key) = new_csr(identity)?;
            let mut fields = std::collections::BTreeMap::new();
            fields.insert(
                "ImpersonatedIdentity".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
                },
            );
            let mut request = tonic::Request::new(IstioCertificateRequest {
                csr,
                validity_duration: lifetime.as_secs() as i64,
                metadata: Some(prost_types::Struct { fields }),
            });
            let md = request.metadata_mut();
            md.insert(
                "authorization",
                MetadataValue::try_from(format!("Bearer {}", self.token())).map_err(|_| {
                    FetchError::Local("the node token is not a valid header value".into())
                })?,
            );
            if let Ok(c) = MetadataValue::try_from(self.cluster.as_str()) {
                md.insert("clusterid", c);
            }
            let response = self
                .client
                .clone()
                .create_certificate(request)
                .await
                .map_err(|s| match s.code() {
                    tonic::Code::PermissionDenied
                    | tonic::Code::InvalidArgument
                    | tonic::Code::Unauthenticated => FetchError::Refused(s.message().to_string()),
                    _ => FetchError::Unavailable(format!("{}: {}", s.code(), s.message())),
                })?;
            credentials(identity, &response.get_ref().cert_chain, key)
        })
    }
}

/// A new ECDSA P-256 key and a CSR naming only `identity`.
pub fn new_csr(identity: &Identity) -> Result<(String, PrivateKeyDer<'static>), FetchError> {
    let key = KeyPair::generate().map_err(|e| FetchError::Local(e.to_string()))?;
    let mut params = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| FetchError::Local(e.to_string()))?;
    params.subject_alt_names =
        vec![SanType::URI(identity.to_string().try_into().map_err(
            |e: rcgen::Error| FetchError::Local(e.to_string()),
        )?)];
    let csr = params
        .serialize_request(&key)
        .map_err(|e| FetchError::Local(e.to_string()))?;
    let pem = csr.pem().map_err(|e| FetchError::Local(e.to_string()))?;
    Ok((
        pem,
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

/// Credentials from the CA's PEM chain, checking it is for the identity asked for.
pub fn credentials(
    identity: &Identity,
    chain_pem: &[String],
    key: PrivateKeyDer<'static>,
) -> Result<Credentials, FetchError> {
    let mut chain: Vec<CertificateDer<'static>> = Vec::new();
    for pem in chain_pem {
        for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
            chain.push(
                c.map_err(|e| FetchError::BadResponse(format!("bad PEM in the chain: {e}")))?,
            );
        }
    }
    let creds =
        Credentials::from_der(chain, key).map_err(|e| FetchError::BadResponse(e.to_string()))?;
    if creds.identity() != identity {
        return Err(FetchError::BadResponse(format!(
            "asked for {identity}, got a certificate for {}",
            creds.identity()
        )));
    }
    Ok(creds)
}

/// The leaf's validity window.
pub fn validity(creds: &Credentials) -> Option<(SystemTime, SystemTime)> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let leaf = creds.chain().first()?;
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    let to_system = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        u64::try_from(secs)
            .ok()
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
    };
    Some((
        to_system(cert.validity().not_before)?,
        to_system(cert.validity().not_after)?,
    ))
}

//! `istio.v1.auth.IstioCertificateService` over gRPC.
//!
//! The node credential is checked from the headers by [`Authenticate`] before the body is
//! decoded, and a request body may be at most [`MAX_REQUEST_BYTES`] (a CSR is about 1 KB): a
//! caller without a credential costs no buffered body, one with a credential at most that.

use std::sync::Arc;
use std::time::Duration;

use ferry_api::citadel::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ferry_api::citadel::{IstioCertificateRequest, IstioCertificateResponse};
use ferry_core::identity::Identity;
use ferry_core::store::Store;
use tonic::{Request, Response, Status};

use crate::ca::auth::{Authenticate, Authenticated, Caller};
use crate::ca::authz;
use crate::ca::k8s::K8sTokens;
use crate::ca::signer::Ca;
use crate::ca::token::NodeTokens;
use crate::metrics::Metrics;

/// The metadata key a node proxy sets to the workload identity it asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// The largest certificate request body decoded (a CSR and its metadata are about 1 KB); a
/// larger one is refused with `OutOfRange` from its length prefix, before it is buffered.
pub const MAX_REQUEST_BYTES: usize = 64 << 10;

/// The service as served: the credential checked from the headers, then the body decoded.
pub type CaServer = Authenticated<IstioCertificateServiceServer<CaService>>;

/// Lifetimes the CA grants.
#[derive(Clone, Debug)]
pub struct Lifetimes {
    /// Granted when the request asks for none.
    pub default: Duration,
    /// The most any request gets.
    pub max: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Self {
            default: Duration::from_secs(24 * 3600),
            max: Duration::from_secs(24 * 3600),
        }
    }
}

/// The certificate service.
#[derive(Debug)]
pub struct CaService {
    ca: Arc<Ca>,
    tokens: Arc<NodeTokens>,
    k8s: Option<Arc<K8sTokens>>,
    store: Arc<Store>,
    lifetimes: Lifetimes,
    metrics: Arc<Metrics>,
}

impl CaService {
    pub fn new(
        ca: Arc<Ca>,
        tokens: Arc<NodeTokens>,
        store: Arc<Store>,
        lifetimes: Lifetimes,
    ) -> Self {
        Self {
            ca,
            tokens,
            k8s: None,
            store,
            lifetimes,
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// Counts into `metrics` (the control plane's one registry) instead of its own.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Also accepts Kubernetes service-account tokens (checked from the headers too).
    #[must_use]
    pub fn with_k8s(mut self, k8s: Option<Arc<K8sTokens>>) -> Self {
        self.k8s = k8s;
        self
    }

    /// What it counts: `ca_requests` decoded, `ca_refused` before decoding.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The tonic server for this service: the credential checked before the body is decoded,
    /// bodies of at most [`MAX_REQUEST_BYTES`].
    pub fn into_server(self) -> CaServer {
        let auth = Authenticate::new(
            Some(self.tokens.clone()),
            tonic::Code::PermissionDenied,
            "certificate request",
            self.metrics.ca_refused.clone(),
        )
        .with_k8s(self.k8s.clone());
        auth.layer(
            IstioCertificateServiceServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES),
        )
    }

    fn handle(&self, request: &Request<IstioCertificateRequest>) -> Result<Vec<String>, Status> {
        let deny = |what: String| {
            tracing::warn!(reason = %what, "certificate request refused");
            Status::permission_denied(what)
        };
        // 1. Who is asking: the node credential (checked from the headers already when served
        // through `into_server`).
        let node = match request.extensions().get::<Caller>() {
            Some(Caller(node)) => node.clone(),
            None => Authenticate::verify(&self.tokens, request)
                .map_err(|e| deny(e.message().to_string()))?,
        };
        let body = request.get_ref();
        // 2. For whom: the impersonated identity, or else the CSR's own.
        let parsed =
            crate::ca::csr::parse(&body.csr).map_err(|e| deny(format!("node {node}: {e}")))?;
        let requested = match impersonated(body) {
            Some(Ok(id)) => id,
            Some(Err(e)) => {
                return Err(Status::invalid_argument(format!(
                    "{IMPERSONATED_IDENTITY}: {e}"
                )));
            }
            None => parsed.identity.clone(),
        };
        if parsed.identity != requested {
            return Err(deny(format!(
                "node {node}: the CSR's SAN is {} but {requested} was requested",
                parsed.identity
            )));
        }
        // 3. Co-location: the identity must run on the caller's node, now.
        let snap = self.store.load();
        let cluster = authz::authorize(&snap, &node, &requested)
            .map_err(|e| deny(format!("node {node}: {e}")))?;
        // 4. Sign, for at most the configured lifetime.
        let lifetime = match u64::try_from(body.validity_duration) {
            Ok(0) | Err(_) => self.lifetimes.default,
            Ok(s) => Duration::from_secs(s),
        }
        .min(self.lifetimes.max);
        let chain = self
            .ca
            .sign(&body.csr, &requested, &cluster, lifetime)
            .map_err(|e| deny(format!("node {node}: {e}")))?;
        tracing::info!(node = %node, identity = %requested, cluster = %cluster, lifetime_s = lifetime.as_secs(), "certificate signed");
        Ok(chain)
    }
}

fn impersonated(req: &IstioCertificateRequest) -> Option<Result<Identity, String>> {
    let v = req.metadata.as_ref()?.fields.get(IMPERSONATED_IDENTITY)?;
    Some(match &v.kind {
        Some(prost_types::value::Kind::StringValue(s)) => s.parse().map_err(|e| format!("{e}")),
        _ => Err("expected a string".to_string()),
    })
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.ca_requests.inc();
        let cert_chain = self.handle(&request)?;
        Ok(Response::new(IstioCertificateResponse { cert_chain }))
    }
}

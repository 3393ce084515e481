//! `istio.v1.auth.IstioCertificateService` over gRPC.

use std::sync::Arc;
use std::time::Duration;

use ferry_api::citadel::istio_certificate_service_server::IstioCertificateService;
use ferry_api::citadel::{IstioCertificateRequest, IstioCertificateResponse};
use ferry_core::identity::Identity;
use ferry_core::store::Store;
use tonic::{Request, Response, Status};

use crate::ca::authz;
use crate::ca::signer::Ca;
use crate::ca::token::NodeTokens;

/// The metadata key a node proxy sets to the workload identity it asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

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
    store: Arc<Store>,
    lifetimes: Lifetimes,
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
            store,
            lifetimes,
        }
    }

    /// The tonic server wrapper for this service.
    pub fn into_server(
        self,
    ) -> ferry_api::citadel::istio_certificate_service_server::IstioCertificateServiceServer<Self>
    {
        ferry_api::citadel::istio_certificate_service_server::IstioCertificateServiceServer::new(
            self,
        )
    }

    fn handle(&self, request: &Request<IstioCertificateRequest>) -> Result<Vec<String>, Status> {
        let deny = |what: String| {
            tracing::warn!(reason = %what, "certificate request refused");
            Status::permission_denied(what)
        };
        // 1. Who is asking: the node credential.
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let node = NodeTokens::from_metadata(auth)
            .and_then(|t| self.tokens.verify(t))
            .map_err(|e| deny(e.to_string()))?;
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
        let cert_chain = self.handle(&request)?;
        Ok(Response::new(IstioCertificateResponse { cert_chain }))
    }
}

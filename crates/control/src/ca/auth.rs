//! The node credential, checked from the request headers before the body is read.
//!
//! [`Authenticated`] wraps a generated gRPC service: it reads the `authorization` header of each
//! request (the first frame of a stream) before the service decodes a single message, so a
//! caller without a valid credential costs one HMAC (a Ferry node token) or one signature check
//! (a Kubernetes service-account token, [`crate::ca::k8s`]) and never a buffered body. The node
//! the credential proves goes into the request's extensions as [`Caller`] for the service.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ferry_core::model::NodeName;
use prometheus_client::metrics::counter::Counter;
use tonic::server::NamedService;
use tonic::{Code, Request, Status};

use crate::ca::k8s::K8sTokens;
use crate::ca::token::NodeTokens;

/// The metadata Istio's node proxy sends its cluster in (its `CLUSTER_ID`).
pub const CLUSTER_ID_HEADER: &str = "clusterid";

/// The node a request's credential proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub NodeName);

/// Judges a request's credential: a Ferry node token, or a Kubernetes service-account token.
#[derive(Clone, Debug)]
pub struct Authenticate {
    /// `None` only in the explicit plaintext, unauthenticated mode for local experiments.
    tokens: Option<Arc<NodeTokens>>,
    /// Service-account tokens, when any cluster's issuer is configured.
    k8s: Option<Arc<K8sTokens>>,
    /// The status code of a refusal.
    code: Code,
    /// What the refusal is logged as.
    what: &'static str,
    refused: Counter,
}

/// A service behind [`Authenticate`]: the credential judged before the inner service runs.
#[derive(Clone, Debug)]
pub struct Authenticated<S> {
    inner: S,
    auth: Authenticate,
}

// === impl Authenticate ===

impl Authenticate {
    /// Checks credentials with `tokens`, refusing with `code` and counting in `refused`.
    pub fn new(
        tokens: Option<Arc<NodeTokens>>,
        code: Code,
        what: &'static str,
        refused: Counter,
    ) -> Self {
        Self {
            tokens,
            k8s: None,
            code,
            what,
            refused,
        }
    }

    /// Also accepts Kubernetes service-account tokens verified by `k8s`.
    #[must_use]
    pub fn with_k8s(mut self, k8s: Option<Arc<K8sTokens>>) -> Self {
        self.k8s = k8s;
        self
    }

    /// Wraps `inner`, which then sees only requests with a valid credential.
    pub fn layer<S>(self, inner: S) -> Authenticated<S> {
        Authenticated { inner, auth: self }
    }

    /// The node `request`'s `authorization` metadata proves, by a Ferry node token.
    pub fn verify<T>(tokens: &NodeTokens, request: &Request<T>) -> Result<NodeName, Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        NodeTokens::from_metadata(auth)
            .and_then(|t| tokens.verify(t))
            .map_err(|e| Status::unauthenticated(e.to_string()))
    }

    /// The caller `headers` prove, `None` when nothing is checked (plaintext mode); a refusal
    /// is logged, counted and has this checker's status code.
    pub async fn check(&self, headers: &http::HeaderMap) -> Result<Option<Caller>, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(None);
        };
        match self.node(tokens, headers).await {
            Ok(node) => Ok(Some(Caller(node))),
            Err(reason) => {
                self.refused.inc();
                tracing::warn!(reason = %reason, what = self.what, "refused before reading the body");
                Err(Status::new(self.code, reason))
            }
        }
    }

    async fn node(
        &self,
        tokens: &NodeTokens,
        headers: &http::HeaderMap,
    ) -> Result<NodeName, String> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let token =
            NodeTokens::from_metadata(header("authorization")).map_err(|e| e.to_string())?;
        match &self.k8s {
            Some(k8s) if K8sTokens::is_jwt(token) => k8s
                .verify(token, header(CLUSTER_ID_HEADER))
                .await
                .map_err(|e| e.to_string()),
            _ => tokens.verify(token).map_err(|e| e.to_string()),
        }
    }
}

// === impl Authenticated ===

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower_service::Service<http::Request<B>> for Authenticated<S>
where
    S: tower_service::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The clone that was made ready is the one that serves (tower's rule for `call`).
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let auth = self.auth.clone();
        Box::pin(async move {
            match auth.check(request.headers()).await {
                Ok(caller) => {
                    if let Some(c) = caller {
                        request.extensions_mut().insert(c);
                    }
                    inner.call(request).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

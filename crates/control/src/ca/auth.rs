//! The node credential, checked from the request headers before the body is read.
//!
//! [`Authenticate`] is a tonic interceptor: it runs on the headers of each request (the first
//! frame of a stream), before the generated service decodes a single message, so a caller
//! without a valid credential costs one HMAC and never a buffered body. The node it proves goes
//! into the request's extensions as [`Caller`] for the service to use.

use std::sync::Arc;

use ferry_core::model::NodeName;
use prometheus_client::metrics::counter::Counter;
use tonic::{Code, Request, Status};

use crate::ca::token::NodeTokens;

/// The node a request's credential proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub NodeName);

/// Refuses a request without a valid node credential, before its body is decoded.
#[derive(Clone, Debug)]
pub struct Authenticate {
    /// `None` only in the explicit plaintext, unauthenticated mode for local experiments.
    tokens: Option<Arc<NodeTokens>>,
    /// The status code of a refusal.
    code: Code,
    /// What the refusal is logged as.
    what: &'static str,
    refused: Counter,
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
            code,
            what,
            refused,
        }
    }

    /// The node `request`'s `authorization` metadata proves.
    pub fn verify<T>(tokens: &NodeTokens, request: &Request<T>) -> Result<NodeName, Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        NodeTokens::from_metadata(auth)
            .and_then(|t| tokens.verify(t))
            .map_err(|e| Status::unauthenticated(e.to_string()))
    }
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(request);
        };
        match Self::verify(tokens, &request) {
            Ok(node) => {
                request.extensions_mut().insert(Caller(node));
                Ok(request)
            }
            Err(e) => {
                self.refused.inc();
                tracing::warn!(reason = %e.message(), what = self.what, "refused before reading the body");
                Err(Status::new(self.code, e.message().to_string()))
            }
        }
    }
}

//! A Kubernetes service-account token to the node it acts for, or the reason it does not.

use std::sync::Arc;

use ferry_core::model::NodeName;
use ferry_core::store::Store;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};

use crate::ca::k8s::binding::{Claims, Denial, bound_node};
use crate::ca::k8s::config::K8sConfig;
use crate::ca::k8s::fetch;
use crate::ca::k8s::keys::{KeyCache, KeyError};

/// Verifies service-account tokens of the configured clusters.
#[derive(Debug)]
pub struct K8sTokens {
    config: K8sConfig,
    clusters: Vec<KeyCache>,
    store: Arc<Store>,
}

// === impl K8sTokens ===

impl K8sTokens {
    /// Checks tokens of `config`'s clusters, binding them to nodes of `store`'s current
    /// snapshot. Fails only on an unreadable `--k8s-ca` file.
    pub fn new(config: K8sConfig, store: Arc<Store>) -> std::io::Result<Self> {
        let mut clusters = Vec::with_capacity(config.issuers.len());
        for issuer in &config.issuers {
            let tls = fetch::tls_config(issuer.ca.as_deref())?;
            clusters.push(KeyCache::new(
                issuer.clone(),
                tls,
                config.refresh_interval,
                config.fetch_timeout,
            ));
        }
        Ok(Self {
            config,
            clusters,
            store,
        })
    }

    /// Whether `token` looks like a JWT (three base64url parts), so it is this verifier's.
    pub fn is_jwt(token: &str) -> bool {
        token.split('.').count() == 3 && token.starts_with("eyJ")
    }

    /// The node `token` acts for. `claimed` is the caller's `clusterid` metadata.
    pub async fn verify(&self, token: &str, claimed: Option<&str>) -> Result<NodeName, Denial> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| Denial::Malformed(e.to_string()))?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(Denial::Algorithm(format!("{:?}", header.alg)));
        }
        // Read unverified only to pick the issuer's keys and to explain a refusal.
        let unverified: Claims = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|e| Denial::Malformed(e.to_string()))?;
        let iss = unverified
            .iss
            .clone()
            .ok_or_else(|| Denial::Malformed("no `iss` claim".to_string()))?;
        // Several clusters may share an issuer name (the default
        // `https://kubernetes.default.svc.cluster.local`); their keys tell them apart.
        let candidates: Vec<&KeyCache> = self
            .clusters
            .iter()
            .filter(|c| c.issuer().issuer == iss)
            .collect();
        if candidates.is_empty() {
            return Err(Denial::UnknownIssuer {
                issuer: iss,
                known: self.known_issuers(),
            });
        }
        let mut refusal = None;
        for cache in &candidates {
            let cluster = &cache.issuer().cluster;
            let keys = match cache.candidates(header.kid.as_deref()).await {
                Ok(k) => k,
                Err(KeyError::UnknownKid(kid)) => {
                    refusal.get_or_insert(Denial::UnknownKey {
                        kid,
                        cluster: cluster.clone(),
                    });
                    continue;
                }
                Err(KeyError::Fetch(reason)) => {
                    refusal.get_or_insert(Denial::Keys {
                        cluster: cluster.clone(),
                        reason,
                    });
                    continue;
                }
            };
            let validation = self.validation(header.alg, &cache.issuer().issuer);
            for key in &keys {
                match jsonwebtoken::decode::<Claims>(token, key, &validation) {
                    Ok(data) => {
                        let snap = self.store.load();
                        return bound_node(
                            &snap,
                            cluster,
                            &data.claims,
                            claimed,
                            &self.config.node_proxy_accounts,
                        );
                    }
                    Err(e) => match e.kind() {
                        ErrorKind::InvalidSignature
                        | ErrorKind::InvalidAlgorithm
                        | ErrorKind::InvalidEcdsaKey
                        | ErrorKind::InvalidRsaKey(_) => {}
                        // The signature verified: the claims are this cluster's word.
                        _ => return Err(self.explain(&e, &unverified)),
                    },
                }
            }
        }
        Err(refusal.unwrap_or_else(|| Denial::BadSignature {
            clusters: candidates
                .iter()
                .map(|c| c.issuer().cluster.to_string())
                .collect::<Vec<_>>()
                .join(" or "),
        }))
    }

    fn validation(&self, alg: Algorithm, issuer: &str) -> Validation {
        let mut v = Validation::new(alg);
        v.set_issuer(&[issuer]);
        v.set_audience(&self.config.audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.validate_nbf = true;
        v
    }

    fn explain(&self, e: &jsonwebtoken::errors::Error, claims: &Claims) -> Denial {
        match e.kind() {
            ErrorKind::ExpiredSignature => Denial::Expired {
                exp: claims.exp.unwrap_or(0),
            },
            ErrorKind::ImmatureSignature => Denial::NotYetValid {
                nbf: claims.nbf.unwrap_or(0),
            },
            ErrorKind::InvalidAudience => Denial::WrongAudience {
                got: claims.aud.clone(),
                want: self.config.audiences.clone(),
            },
            ErrorKind::MissingRequiredClaim(c) if c == "aud" => Denial::WrongAudience {
                got: Vec::new(),
                want: self.config.audiences.clone(),
            },
            _ => Denial::Malformed(e.to_string()),
        }
    }

    fn known_issuers(&self) -> String {
        let known: Vec<String> = self
            .clusters
            .iter()
            .map(|c| format!("{} ({})", c.issuer().issuer, c.issuer().cluster))
            .collect();
        if known.is_empty() {
            "none: start `ferry control serve` with --k8s-issuer".to_string()
        } else {
            known.join(", ")
        }
    }
}

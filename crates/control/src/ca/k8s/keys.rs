//! One cluster's token-signing keys: fetched on first use, refetched when a token names a `kid`
//! the cache lacks (a key rotation), at most once per refresh interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::DecodingKey;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::ca::k8s::config::{ClusterIssuer, KeySource};
use crate::ca::k8s::fetch;

/// The keys of one cluster.
#[derive(Debug)]
pub struct KeyCache {
    issuer: ClusterIssuer,
    tls: Arc<rustls::ClientConfig>,
    refresh_interval: Duration,
    fetch_timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By `kid`; a key without one is kept under `""`.
    keys: HashMap<String, DecodingKey>,
    fetched: Option<Instant>,
    /// Why the last fetch failed, while it is the latest word.
    failed: Option<String>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .field("fetched", &self.fetched)
            .field("failed", &self.failed)
            .finish()
    }
}

/// Why the keys could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no key {0:?}")]
    UnknownKid(String),
    #[error("{0}")]
    Fetch(String),
}

#[derive(Deserialize)]
struct Discovery {
    jwks_uri: String,
}

#[derive(Deserialize)]
struct KeySet {
    keys: Vec<serde_json::Value>,
}

// === impl KeyCache ===

impl KeyCache {
    pub fn new(
        issuer: ClusterIssuer,
        tls: Arc<rustls::ClientConfig>,
        refresh_interval: Duration,
        fetch_timeout: Duration,
    ) -> Self {
        Self {
            issuer,
            tls,
            refresh_interval,
            fetch_timeout,
            state: Mutex::new(State::default()),
        }
    }

    pub fn issuer(&self) -> &ClusterIssuer {
        &self.issuer
    }

    /// The keys that may have signed a token with header `kid`: that one key, or every key
    /// when the token names none.
    pub async fn candidates(&self, kid: Option<&str>) -> Result<Vec<DecodingKey>, KeyError> {
        let mut st = self.state.lock().await;
        if let Some(found) = pick(&st.keys, kid) {
            return Ok(found);
        }
        let due = st
            .fetched
            .is_none_or(|t| t.elapsed() >= self.refresh_interval);
        if due {
            st.fetched = Some(Instant::now());
            match self.fetch().await {
                Ok(keys) => {
                    tracing::info!(cluster = %self.issuer.cluster, keys = keys.len(), "service-account token keys fetched");
                    st.keys = keys;
                    st.failed = None;
                }
                Err(e) => {
                    // The keys held so far stay: a failed refresh revokes nothing.
                    tracing::warn!(cluster = %self.issuer.cluster, error = %e, "service-account token keys");
                    st.failed = Some(e);
                }
            }
        }
        match (pick(&st.keys, kid), &st.failed) {
            (Some(found), _) => Ok(found),
            (None, Some(e)) => Err(KeyError::Fetch(e.clone())),
            (None, None) => Err(KeyError::UnknownKid(kid.unwrap_or("").to_string())),
        }
    }

    async fn fetch(&self) -> Result<HashMap<String, DecodingKey>, String> {
        let get = |url: String| async move {
            fetch::get(&url, &self.tls, self.fetch_timeout)
                .await
                .map_err(|e| e.to_string())
        };
        let doc = match &self.issuer.keys {
            KeySource::File(p) => tokio::fs::read(p)
                .await
                .map_err(|e| format!("{}: {e}", p.display()))?
                .into(),
            KeySource::Url(u) => get(u.clone()).await?,
            KeySource::Discovery => {
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    self.issuer.issuer.trim_end_matches('/')
                );
                let body = get(url.clone()).await?;
                let d: Discovery = serde_json::from_slice(&body)
                    .map_err(|e| format!("{url}: not a discovery document: {e}"))?;
                get(d.jwks_uri).await?
            }
        };
        parse_key_set(&doc)
    }
}

/// The signature keys of a JWKS document: RSA and EC keys only (never a shared secret), each
/// under its `kid`; a key Ferry cannot use is skipped.
pub fn parse_key_set(doc: &[u8]) -> Result<HashMap<String, DecodingKey>, String> {
    let set: KeySet = serde_json::from_slice(doc).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut out = HashMap::new();
    for v in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(v) else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
            continue;
        }
        if !matches!(
            jwk.algorithm,
            AlgorithmParameters::RSA(_) | AlgorithmParameters::EllipticCurve(_)
        ) {
            continue;
        }
        if let Ok(key) = DecodingKey::from_jwk(&jwk) {
            out.insert(jwk.common.key_id.clone().unwrap_or_default(), key);
        }
    }
    if out.is_empty() {
        return Err("the JWKS has no RSA or EC signature key".to_string());
    }
    Ok(out)
}

fn pick(keys: &HashMap<String, DecodingKey>, kid: Option<&str>) -> Option<Vec<DecodingKey>> {
    match kid {
        Some(k) => keys.get(k).map(|key| vec![key.clone()]),
        None if keys.is_empty() => None,
        None => Some(keys.values().cloned().collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_set_keeps_only_signature_keys_of_rsa_and_ec() {
        let doc = br#"{"keys":[
            {"kty":"oct","kid":"hmac","k":"c2VjcmV0"},
            {"kty":"EC","kid":"ec","crv":"P-256","use":"sig",
             "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"EC","kid":"enc","crv":"P-256","use":"enc",
             "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"weird"}
        ]}"#;
        let keys = parse_key_set(doc).unwrap();
        assert_eq!(keys.keys().collect::<Vec<_>>(), vec!["ec"]);
        assert!(parse_key_set(br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#).is_err());
        assert!(parse_key_set(b"nope").is_err());
    }
}

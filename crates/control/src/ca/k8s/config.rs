//! What `ferry control` trusts: per cluster, the issuer of its service-account tokens and where
//! its keys are; the audiences a token must carry; the service accounts node proxies run as.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ferry_core::model::ClusterId;

/// The audience Istio's node proxy requests for its token (`istio-ca`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// Where a cluster's token-signing keys are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `<issuer>/.well-known/openid-configuration`, then its `jwks_uri`.
    Discovery,
    /// A JWKS document at this `http://` or `https://` URL.
    Url(String),
    /// A JWKS document in this file (e.g. `kubectl get --raw /openid/v1/jwks`), reread on an
    /// unknown `kid`.
    File(PathBuf),
}

/// One cluster's token issuer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterIssuer {
    pub cluster: ClusterId,
    /// The `iss` its tokens carry, exactly (the API server's `--service-account-issuer`).
    pub issuer: String,
    pub keys: KeySource,
    /// Roots (PEM) to verify an `https://` key source against; the system's roots otherwise.
    pub ca: Option<PathBuf>,
}

/// A Kubernetes service account, `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

/// What the Kubernetes token check trusts.
#[derive(Clone, Debug)]
pub struct K8sConfig {
    pub issuers: Vec<ClusterIssuer>,
    /// A token must carry one of these audiences.
    pub audiences: Vec<String>,
    /// The service accounts node proxies run as: only their tokens act for a node. Istio's
    /// `CA_TRUSTED_NODE_ACCOUNTS` (default `istio-system/ztunnel`).
    pub node_proxy_accounts: Vec<ServiceAccount>,
    /// Keys are refetched on an unknown `kid` at most this often per cluster, so a flood of
    /// made-up `kid`s costs one fetch per interval.
    pub refresh_interval: Duration,
    /// The longest one fetch (connect, TLS, response) may take.
    pub fetch_timeout: Duration,
}

impl Default for K8sConfig {
    fn default() -> Self {
        Self {
            issuers: Vec::new(),
            audiences: vec![DEFAULT_AUDIENCE.to_string()],
            node_proxy_accounts: vec![ServiceAccount {
                namespace: "istio-system".to_string(),
                name: "ztunnel".to_string(),
            }],
            refresh_interval: Duration::from_secs(10),
            fetch_timeout: Duration::from_secs(5),
        }
    }
}

// === impl ServiceAccount ===

impl fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl FromStr for ServiceAccount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("expected NAMESPACE/NAME, found {s:?}")),
        }
    }
}

/// Splits a `CLUSTER=VALUE` argument.
pub fn cluster_value(s: &str) -> Result<(ClusterId, String), String> {
    match s.split_once('=') {
        Some((c, v)) if !c.is_empty() && !v.is_empty() => Ok((ClusterId::new(c), v.to_string())),
        _ => Err(format!("expected CLUSTER=VALUE, found {s:?}")),
    }
}

impl K8sConfig {
    /// The configuration of `--k8s-issuer CLUSTER=URL` (each), `--k8s-jwks CLUSTER=FILE|URL`
    /// and `--k8s-ca CLUSTER=FILE`: every cluster with a JWKS or a CA must have an issuer.
    pub fn from_args(
        issuers: &[String],
        jwks: &[String],
        cas: &[String],
    ) -> Result<Vec<ClusterIssuer>, String> {
        let mut out: Vec<ClusterIssuer> = Vec::new();
        for a in issuers {
            let (cluster, issuer) = cluster_value(a)?;
            if out.iter().any(|c| c.cluster == cluster) {
                return Err(format!("--k8s-issuer: cluster {cluster} given twice"));
            }
            out.push(ClusterIssuer {
                cluster,
                issuer,
                keys: KeySource::Discovery,
                ca: None,
            });
        }
        let find = |out: &mut Vec<ClusterIssuer>, cluster: &ClusterId, flag: &str| {
            out.iter_mut()
                .position(|c| &c.cluster == cluster)
                .ok_or_else(|| format!("{flag}: cluster {cluster} has no --k8s-issuer"))
        };
        for a in jwks {
            let (cluster, v) = cluster_value(a)?;
            let i = find(&mut out, &cluster, "--k8s-jwks")?;
            out[i].keys = if v.starts_with("http://") || v.starts_with("https://") {
                KeySource::Url(v)
            } else {
                KeySource::File(PathBuf::from(v))
            };
        }
        for a in cas {
            let (cluster, v) = cluster_value(a)?;
            let i = find(&mut out, &cluster, "--k8s-ca")?;
            out[i].ca = Some(PathBuf::from(v));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_make_one_issuer_per_cluster_with_its_key_source() {
        let got = K8sConfig::from_args(
            &[
                "east=https://oidc.example/east".into(),
                "west=https://kubernetes.default.svc".into(),
            ],
            &[
                "west=/etc/ferry/west-jwks.json".into(),
                "east=http://127.0.0.1:1/keys".into(),
            ],
            &["west=/etc/ferry/west-ca.pem".into()],
        )
        .unwrap();
        assert_eq!(
            got[0].keys,
            KeySource::Url("http://127.0.0.1:1/keys".into())
        );
        assert_eq!(
            got[1].keys,
            KeySource::File("/etc/ferry/west-jwks.json".into())
        );
        assert_eq!(got[1].ca, Some(PathBuf::from("/etc/ferry/west-ca.pem")));
        assert!(K8sConfig::from_args(&[], &["east=/x".into()], &[]).is_err());
        assert!(K8sConfig::from_args(&["east".into()], &[], &[]).is_err());
        assert!(K8sConfig::from_args(&["a=x".into(), "a=y".into()], &[], &[]).is_err());
        assert_eq!(
            "istio-system/ztunnel"
                .parse::<ServiceAccount>()
                .unwrap()
                .to_string(),
            "istio-system/ztunnel"
        );
        assert!("ztunnel".parse::<ServiceAccount>().is_err());
    }
}

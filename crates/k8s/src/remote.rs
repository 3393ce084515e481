//! Remote clusters from Secrets as Istio writes them (`istioctl create-remote-secret`): a
//! Secret labelled `istio/multiCluster: "true"` whose every data key is a cluster ID and whose
//! value is a kubeconfig for that cluster's API server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The label Istio's remote secrets carry.
pub const MULTI_CLUSTER_LABEL: &str = "istio/multiCluster";

/// One remote cluster: its ID and a kubeconfig for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteCluster {
    pub id: String,
    pub kubeconfig: String,
}

/// Why a remote secret cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RemoteSecretError {
    #[error("{source_name}: expected a Secret in YAML, found: {message}")]
    NotASecret {
        source_name: String,
        message: String,
    },
    #[error(
        "{source_name}: Secret {name} lacks the label {MULTI_CLUSTER_LABEL}: \"true\" (is it an Istio remote secret?)"
    )]
    NotRemote { source_name: String, name: String },
    #[error("{source_name}: Secret {name}: key {key:?} holds no UTF-8 kubeconfig")]
    NotText {
        source_name: String,
        name: String,
        key: String,
    },
    #[error("{source_name}: Secret {name} names no cluster (no data keys)")]
    Empty { source_name: String, name: String },
}

/// The clusters of one remote secret, given as YAML (`source_name` names it in errors).
pub fn parse_remote_secret(
    source_name: &str,
    text: &str,
) -> Result<Vec<RemoteCluster>, RemoteSecretError> {
    let secret: Secret =
        serde_yaml_ng::from_str(text).map_err(|e| RemoteSecretError::NotASecret {
            source_name: source_name.to_string(),
            message: e.to_string(),
        })?;
    clusters_of(source_name, secret)
}

/// The clusters of one remote secret (`source_name` names it in errors): every data and
/// string-data key is a cluster ID, its value that cluster's kubeconfig.
pub fn clusters_of(
    source_name: &str,
    secret: Secret,
) -> Result<Vec<RemoteCluster>, RemoteSecretError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let labelled = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MULTI_CLUSTER_LABEL))
        .is_some_and(|v| v == "true");
    if !labelled {
        return Err(RemoteSecretError::NotRemote {
            source_name: source_name.to_string(),
            name,
        });
    }
    let mut clusters: BTreeMap<String, String> = secret.string_data.unwrap_or_default();
    for (key, bytes) in secret.data.unwrap_or_default() {
        let text = String::from_utf8(bytes.0).map_err(|_| RemoteSecretError::NotText {
            source_name: source_name.to_string(),
            name: name.clone(),
            key: key.clone(),
        })?;
        clusters.entry(key).or_insert(text);
    }
    if clusters.is_empty() {
        return Err(RemoteSecretError::Empty {
            source_name: source_name.to_string(),
            name,
        });
    }
    Ok(clusters
        .into_iter()
        .map(|(id, kubeconfig)| RemoteCluster { id, kubeconfig })
        .collect())
}

/// Why a remote cluster's kubeconfig gives no client.
#[derive(Debug, thiserror::Error)]
pub enum RemoteConfigError {
    #[error("{source_name}: cluster {cluster}'s kubeconfig: {message}")]
    Invalid {
        source_name: String,
        cluster: String,
        message: String,
    },
    #[error(
        "{source_name}: cluster {cluster}'s kubeconfig runs a command or an auth provider for its credentials; refused (give it a token or a client certificate)"
    )]
    RunsCommand {
        source_name: String,
        cluster: String,
    },
}

/// A client for remote cluster `remote` (`source_name` names its secret in errors). Like
/// Istio, a kubeconfig whose credentials execute a command or call an auth provider is
/// refused: a remote secret is data, not a program to run.
pub async fn connect(
    source_name: &str,
    remote: &RemoteCluster,
) -> Result<kube::Client, RemoteConfigError> {
    let invalid = |message: String| RemoteConfigError::Invalid {
        source_name: source_name.to_string(),
        cluster: remote.id.clone(),
        message,
    };
    let kc = Kubeconfig::from_yaml(&remote.kubeconfig).map_err(|e| invalid(e.to_string()))?;
    let runs = kc.auth_infos.iter().any(|a| {
        a.auth_info
            .as_ref()
            .is_some_and(|i| i.exec.is_some() || i.auth_provider.is_some())
    });
    if runs {
        return Err(RemoteConfigError::RunsCommand {
            source_name: source_name.to_string(),
            cluster: remote.id.clone(),
        });
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "\
apiVersion: v1
kind: Secret
metadata:
  name: istio-remote-secret-beta
  namespace: istio-system
  labels: {istio/multiCluster: \"true\"}
  annotations: {networking.istio.io/cluster: beta}
stringData:
  beta: |
    apiVersion: v1
    kind: Config
    clusters: [{name: beta, cluster: {server: 'https://198.18.200.2:6443'}}]
";

    #[test]
    fn an_istioctl_remote_secret_names_its_cluster() {
        let c = parse_remote_secret("s.yaml", SECRET).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].id, "beta");
        assert!(c[0].kubeconfig.contains("https://198.18.200.2:6443"));
    }

    #[test]
    fn data_is_read_as_well_as_string_data() {
        // base64 of "kubeconfig-text"
        let doc = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, labels: {istio/multiCluster: \"true\"}}\ndata: {gamma: a3ViZWNvbmZpZy10ZXh0}\n";
        let c = parse_remote_secret("s.yaml", doc).unwrap();
        assert_eq!(
            c,
            [RemoteCluster {
                id: "gamma".into(),
                kubeconfig: "kubeconfig-text".into()
            }]
        );
    }

    #[test]
    fn other_secrets_are_refused_with_the_reason() {
        let doc = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {a: b}\n";
        let e = parse_remote_secret("s.yaml", doc).unwrap_err().to_string();
        assert!(e.contains("lacks the label istio/multiCluster"), "{e}");
        let e = parse_remote_secret("s.yaml", "[1, 2")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.yaml: expected a Secret in YAML"), "{e}");
        let doc = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, labels: {istio/multiCluster: \"true\"}}\n";
        let e = parse_remote_secret("s.yaml", doc).unwrap_err().to_string();
        assert!(e.contains("names no cluster"), "{e}");
    }
}

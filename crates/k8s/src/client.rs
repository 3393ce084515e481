//! A client for one API server: from a kubeconfig file when one is named, else from where kube
//! finds one (in a pod, its service account; elsewhere `KUBECONFIG` or `~/.kube/config`).

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why no client could be made, naming the file when one was given.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading the kubeconfig {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: KubeconfigError,
    },
    #[error("the kubeconfig {}: {source}", path.display())]
    Config {
        path: PathBuf,
        source: KubeconfigError,
    },
    #[error("no kubeconfig given and none found (in-cluster or ~/.kube/config): {0}")]
    Infer(#[source] InferConfigError),
    #[error("a client from the configuration: {0}")]
    Client(#[source] kube::Error),
}

/// A client from `kubeconfig` (its current context), else from where kube finds one.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Config {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer)?,
    };
    kube::Client::try_from(config).map_err(ClientError::Client)
}

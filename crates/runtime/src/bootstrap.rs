//! What every data-plane program does first: subscribe to the mesh over xDS, and get
//! certificates from the CA. Written once here, used by the node proxy, the waypoint and the
//! gateway.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::store::Store;
use ferry_tls::ca_client::GrpcCa;
use ferry_tls::certs::{CertManager, ManagerConfig};
use ferry_tls::config::TrustBundle;
use ferry_xds::client::{ClientConfig, XdsClient};
use tokio::sync::watch;

/// The name the control plane's certificate is issued for.
const CONTROL_SERVER_NAME: &str = "ferry-control";

/// Why a program could not start.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("trust bundle: {0}")]
    Bundle(#[source] ferry_tls::error::TlsError),
    #[error("CA client for {endpoint}: {source}")]
    Ca {
        endpoint: String,
        #[source]
        source: ferry_tls::ca_client::FetchError,
    },
    #[error("the control plane at {0} went away before the first xDS sync")]
    Xds(String),
}

/// The control plane a program talks to, and its credential.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    /// `https://ip:port`.
    pub endpoint: String,
    /// The node's credential (`ferry control token`).
    pub token: String,
    /// The mesh's trust bundle, PEM.
    pub bundle_pem: String,
    /// LOCAL EXPERIMENTS ONLY: xDS without TLS.
    pub plaintext: bool,
}

/// The mesh as this process sees it: the current snapshot, and when it is first complete.
#[derive(Clone, Debug)]
pub struct Mesh {
    pub store: Arc<Store>,
    ready: watch::Receiver<bool>,
    changes: watch::Receiver<u64>,
}

// === impl ControlPlane ===

impl ControlPlane {
    /// The configured roots (replaced by the roots that come with certificates).
    pub fn bundle(&self) -> Result<TrustBundle, BootError> {
        TrustBundle::from_pem(&self.bundle_pem).map_err(BootError::Bundle)
    }

    /// Subscribes to the mesh as `node_id` of `cluster`; the client runs on its own task,
    /// reconnecting with backoff, for as long as the process does.
    pub fn subscribe(&self, node_id: String, cluster: &str) -> Mesh {
        let store = Arc::new(Store::default());
        let xds = XdsClient::new(
            ClientConfig {
                endpoint: self.endpoint.clone(),
                bundle_pem: self.bundle_pem.clone(),
                server_name: CONTROL_SERVER_NAME.into(),
                token: self.token.clone(),
                cluster: cluster.to_string(),
                node_id,
                plaintext: self.plaintext,
                backoff_initial: Duration::from_millis(100),
                backoff_max: Duration::from_secs(15),
            },
            store.clone(),
        );
        let (ready, changes) = (xds.ready(), xds.changes());
        tokio::spawn(xds.run());
        Mesh {
            store,
            ready,
            changes,
        }
    }

    /// A certificate manager fetching from this control plane's CA for workloads of `cluster`.
    pub fn certificates(&self, cluster: &str) -> Result<CertManager, BootError> {
        let ca = GrpcCa::new(
            &self.endpoint,
            &self.bundle_pem,
            CONTROL_SERVER_NAME,
            self.token.clone(),
            cluster.to_string(),
        )
        .map_err(|source| BootError::Ca {
            endpoint: self.endpoint.clone(),
            source,
        })?;
        Ok(CertManager::new(Arc::new(ca), ManagerConfig::default()))
    }
}

// === impl Mesh ===

impl Mesh {
    /// A receiver that turns true at the first full sync.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// Waits for the first full sync.
    pub async fn wait_ready(&self, endpoint: &str) -> Result<(), BootError> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| BootError::Xds(endpoint.to_string()))
    }

    /// Changes whenever a new snapshot is applied (its value is the snapshot's version): what
    /// long-lived connections wait on to be judged again.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }
}

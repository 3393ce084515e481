//! What every data-plane program does first: subscribe to the mesh over xDS, and get
//! certificates from the CA. Written once here, used by the node proxy, the waypoint and the
//! gateway.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::store::Store;
use ferry_tls::ca_client::GrpcCa;
use ferry_tls::certs::{CertManager, ManagerConfig};
use ferry_tls::config::TrustBundle;
use ferry_xds::client::{ADMIN_ADDRESS_KEY, ClientConfig, XdsClient};
use tokio::sync::watch;

/// The name the control plane's certificate is issued for.
pub const CONTROL_SERVER_NAME: &str = "ferry-control";

/// The name istiod's serving certificate carries (Istio's node proxy verifies it).
pub const ISTIOD_SERVER_NAME: &str = "istiod.istio-system.svc";

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
    /// The CA, when it is not at `endpoint` (Istio's `CA_ADDRESS`).
    pub ca_endpoint: Option<String>,
    /// The roots the CA's certificate is verified against, when not `bundle_pem` (Istio's
    /// `CA_ROOT_CA`).
    pub ca_bundle_pem: Option<String>,
    /// The name the xDS server's certificate must carry ([`server_name_for`] by default).
    pub xds_server_name: String,
    /// The name the CA's certificate must carry.
    pub ca_server_name: String,
    /// Where `token` was read from, reread at each CA request and xDS connect (a projected
    /// Kubernetes token is rotated while the process runs).
    pub token_file: Option<std::path::PathBuf>,
    /// This program's admin endpoint, told to the control plane in the xDS node metadata
    /// ([`ferry_xds::client::ADMIN_ADDRESS_KEY`]): its mesh map gathers records from there.
    pub admin: Option<std::net::SocketAddr>,
}

/// The server name to expect at `endpoint`: istiod's own when the host is an istiod service
/// (`istiod`, `istiod.istio-system`, `istiod-1-22.istio-system.svc.cluster.local`: the name up
/// to `.svc`, as its certificate lists it), else Ferry's control plane's.
pub fn server_name_for(endpoint: &str) -> String {
    let host = endpoint
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .unwrap_or_default();
    if !host.starts_with("istiod") {
        return CONTROL_SERVER_NAME.to_string();
    }
    let labels: Vec<&str> = host.split('.').collect();
    match labels.as_slice() {
        [name] => format!("{name}.istio-system.svc"),
        [name, ns] => format!("{name}.{ns}.svc"),
        [name, ns, "svc", ..] => format!("{name}.{ns}.svc"),
        _ => ISTIOD_SERVER_NAME.to_string(),
    }
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
    /// The control plane at `endpoint` for both xDS and the CA, its name by
    /// [`server_name_for`].
    pub fn new(endpoint: String, token: String, bundle_pem: String, plaintext: bool) -> Self {
        let name = server_name_for(&endpoint);
        Self {
            endpoint,
            token,
            bundle_pem,
            plaintext,
            ca_endpoint: None,
            ca_bundle_pem: None,
            xds_server_name: name.clone(),
            ca_server_name: name,
            token_file: None,
            admin: None,
        }
    }

    /// The CA's address.
    pub fn ca_endpoint(&self) -> &str {
        self.ca_endpoint.as_deref().unwrap_or(&self.endpoint)
    }

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
                server_name: self.xds_server_name.clone(),
                token: self.token.clone(),
                cluster: cluster.to_string(),
                node_id,
                plaintext: self.plaintext,
                backoff_initial: Duration::from_millis(100),
                backoff_max: Duration::from_secs(15),
            },
            store.clone(),
        );
        let xds = match &self.token_file {
            Some(p) => xds.with_token_file(p.clone()),
            None => xds,
        };
        let xds = match self.admin {
            Some(a) => xds.with_metadata(
                [(ADMIN_ADDRESS_KEY.to_string(), a.to_string())]
                    .into_iter()
                    .collect(),
            ),
            None => xds,
        };
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
            self.ca_endpoint(),
            self.ca_bundle_pem.as_deref().unwrap_or(&self.bundle_pem),
            &self.ca_server_name,
            self.token.clone(),
            cluster.to_string(),
        )
        .map_err(|source| BootError::Ca {
            endpoint: self.ca_endpoint().to_string(),
            source,
        })?;
        let ca = match &self.token_file {
            Some(p) => ca.with_token_file(p.clone()),
            None => ca,
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_istiod_address_expects_istiods_name_and_anything_else_ferrys() {
        for (endpoint, name) in [
            (
                "https://istiod.istio-system.svc:15012",
                "istiod.istio-system.svc",
            ),
            ("https://istiod:15012", "istiod.istio-system.svc"),
            ("https://istiod.mesh:15012", "istiod.mesh.svc"),
            (
                "https://istiod-1-22.istio-system.svc.cluster.local:15012",
                "istiod-1-22.istio-system.svc",
            ),
            ("https://198.18.0.1:15012", "ferry-control"),
            ("https://ferry-control.ferry.svc:15012", "ferry-control"),
        ] {
            assert_eq!(server_name_for(endpoint), name, "{endpoint}");
        }
    }
}

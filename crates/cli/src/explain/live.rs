//! `ferry explain --control URL`: the mesh a running control plane serves, read once over
//! delta xDS exactly as a node proxy reads it (`ferry_xds::client`: the same decoding, the same
//! snapshot assembly), then explained on.
//!
//! A node proxy's `/config_dump` is not a source: it shows counts and certificates, not the
//! resources, so no snapshot can be rebuilt from it; the control plane's stream is the whole
//! state, as every node proxy has it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_core::snapshot::Snapshot;
use ferry_core::store::Store;
use ferry_xds::client::{ClientConfig, XdsClient};

/// Where the control plane is and how to be let in, as a node proxy is.
#[derive(Debug, clap::Args)]
pub(crate) struct ControlSource {
    /// Explain on the mesh a running control plane serves: subscribe to its delta xDS once,
    /// as a node proxy does, wait for the first full sync and explain on that snapshot.
    /// `https://host:port` (without a scheme, `https://` is meant). In the lab, run it where the
    /// control plane is reachable: `ferry lab exec <node> -- ferry explain --control
    /// https://198.19.254.1:15012 --bundle-file /run/ferry-lab/bundle.pem --token-file
    /// /run/ferry-lab/<node>.token ...`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["topology", "lab"])]
    pub(crate) control: Option<String>,
    /// With --control: the file holding a node credential (`ferry control token --node NAME`).
    #[arg(long, requires = "control", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// With --control: the trust bundle (`ferry control bundle`) its certificate is verified
    /// against.
    #[arg(long, requires = "control", value_name = "FILE")]
    bundle_file: Option<PathBuf>,
    /// With --control: the name its certificate must carry (default as `ferry node`:
    /// `ferry-control`, or istiod's for an istiod address).
    #[arg(long, requires = "control")]
    server_name: Option<String>,
    /// With --control: the cluster this client says it is in (sent as Istio's `clusterid`).
    #[arg(long, requires = "control", default_value = "")]
    cluster: String,
    /// With --control: seconds to wait for the first full sync.
    #[arg(long, requires = "control", default_value_t = 10)]
    sync_timeout: u64,
    /// With --control: LOCAL EXPERIMENTS ONLY, a control plane serving without TLS.
    #[arg(long, requires = "control")]
    plaintext: bool,
}

// === impl ControlSource ===

impl ControlSource {
    /// The endpoint as dialled: with its scheme.
    pub(crate) fn endpoint(&self) -> Option<String> {
        let address = self.control.as_deref()?;
        Some(if address.contains("://") {
            address.to_string()
        } else if self.plaintext {
            format!("http://{address}")
        } else {
            format!("https://{address}")
        })
    }

    /// Subscribes once, waits for the first full sync of both types, and returns the snapshot
    /// it built. An unreachable or refusing control plane is an error that says what failed.
    pub(crate) fn snapshot(&self) -> anyhow::Result<Arc<Snapshot>> {
        let endpoint = self.endpoint().context("no --control")?;
        let read = |p: &PathBuf, what: &str| {
            std::fs::read_to_string(p).with_context(|| format!("{what} {}", p.display()))
        };
        let (token, bundle_pem) = match (&self.token_file, &self.bundle_file) {
            (Some(t), Some(b)) => (
                read(t, "reading the token file")?.trim().to_string(),
                read(b, "reading the trust bundle")?,
            ),
            (t, None) if self.plaintext => (
                t.as_ref()
                    .map(|t| read(t, "reading the token file"))
                    .transpose()?
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
                String::new(),
            ),
            _ => bail!(
                "--control {endpoint} needs --bundle-file (the trust bundle, `ferry control bundle`) \
                 and --token-file (a node credential, `ferry control token --node NAME`)"
            ),
        };
        let config = ClientConfig {
            server_name: self
                .server_name
                .clone()
                .unwrap_or_else(|| ferry_runtime::bootstrap::server_name_for(&endpoint)),
            endpoint,
            bundle_pem,
            token,
            cluster: self.cluster.clone(),
            node_id: format!("ferry-explain~{}", std::process::id()),
            plaintext: self.plaintext,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
        };
        let timeout = Duration::from_secs(self.sync_timeout);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(sync_once(config, timeout))
    }
}

/// The snapshot of the first full sync from the control plane `config` names. The first failed
/// session ends the wait: a one-shot reader reports it rather than retry.
async fn sync_once(config: ClientConfig, timeout: Duration) -> anyhow::Result<Arc<Snapshot>> {
    let endpoint = config.endpoint.clone();
    let store = Arc::new(Store::default());
    let client = XdsClient::new(config, store.clone());
    let state = client.state();
    let ready = client.ready();
    let task = tokio::spawn(client.run());
    let waited = tokio::time::timeout(timeout, async {
        loop {
            if *ready.borrow() {
                return Ok(());
            }
            if let Some(e) = state.lock().last_error.clone() {
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    task.abort();
    match waited {
        Ok(Ok(())) => Ok(store.load()),
        Ok(Err(e)) => bail!("the control plane at {endpoint}: {e}"),
        Err(_) => bail!(
            "no xDS sync from the control plane at {endpoint} within {} s",
            timeout.as_secs()
        ),
    }
}
